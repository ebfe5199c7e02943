"""`trace --top`'s view: the trace's own log lines wait while the screen owns the terminal,
then come out as they would have, in order, at their levels."""

from __future__ import annotations

import io
import logging

from gpuflight.traceview import _HeldLogs


def test_log_lines_wait_for_the_screen_then_come_out_in_order() -> None:
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("gpuflight: %(message)s"))
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    held = _HeldLogs()
    try:
        held.start()
        log = logging.getLogger("gpuflight.producer.trace")
        log.error("capture failed (x): cmd runs on, untraced from here")
        log.info("not at the handler's level")
        log.warning("2 events were dropped")
        assert stream.getvalue() == ""  # nothing drawn over the screen
        held.let_out()
        assert stream.getvalue().splitlines() == [
            "gpuflight: capture failed (x): cmd runs on, untraced from here",
            "gpuflight: 2 events were dropped"]
        held.let_out()  # again: nothing more
        logging.getLogger("gpuflight").warning("after")
        assert stream.getvalue().splitlines()[-1] == "gpuflight: after"
        assert held not in root.handlers
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
