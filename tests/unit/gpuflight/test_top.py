"""`gpuflight top` as a person uses it, on rows made up here (tests/system/test_top.py runs it
in tmux on a real capture): the screen sorts, filters and opens a process's details; --once and
--json print the same rows; a terminal too small or none is one line."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gpuflight import cli
from gpuflight.producer.toptable import KernelRow, ProcessRow, RouteRow, ShapeRow
from gpuflight.topcolumns import KEYS, plain_table, sorted_rows
from gpuflight.topscreen import DetailScreen, TopApp


def _row(pid: int, launches: float, pod: str = "-", **kw: object) -> ProcessRow:
    fields: dict[str, object] = dict(
        pid=pid, command=f"cmd{pid}", job=f"cmd{pid}:{pid}", pod=pod, container="-",
        devices=(0,), launches_per_s=launches, blocks_per_launch=64.0, top_kernel="axpy",
        h2d_gb_per_s=0.5, d2h_gb_per_s=0.25, blocked_pct=12.5, gpu_s_per_s=None,
        usd_per_h=None, requests_per_s=None, p99_ms=None,
        kernels=(KernelRow("axpy", launches, 1.0),),
        shapes=(ShapeRow("64x1x1", "128x1x1", launches),),
        routes=(RouteRow("/v1/x", 3.0, 12.5),))
    fields.update(kw)
    return ProcessRow(**fields)  # type: ignore[arg-type]


ROWS = [_row(1, 10), _row(2, 300, pod="ml/trainer-0"), _row(3, 50, pod="web/api-7",
                                                              requests_per_s=40.0)]


def test_rows_sort_by_a_column_and_filter_by_pod_or_command() -> None:
    assert [r.pid for r in sorted_rows(ROWS, "launches_per_s")] == [2, 3, 1]
    assert [r.pid for r in sorted_rows(ROWS, "pid")] == [1, 2, 3]
    assert [r.pid for r in sorted_rows(ROWS, "requests_per_s")] == [3, 1, 2]  # None last
    assert [r.pid for r in sorted_rows(ROWS, "launches_per_s", "ML/")] == [2]
    assert [r.pid for r in sorted_rows(ROWS, "launches_per_s", "cmd1")] == [1]


def test_the_plain_table_has_every_column_and_row() -> None:
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(plain_table(ROWS, "launches_per_s"))
    text = console.export_text()
    assert "LAUNCH/S ▼" in text and "P99 MS" in text and "$/H" in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert [line.split()[0] for line in lines[1:]] == ["2", "3", "1"]


class _Feed:
    """The rows once, then nothing more: a source blocked in its read (an agent gone quiet),
    which quitting must not wait for."""

    def __init__(self, rows: list[ProcessRow]) -> None:
        self.rows = rows
        self.given = False
        self.never = threading.Event()

    def next_rows(self) -> list[ProcessRow]:
        if self.given:
            self.never.wait()
        self.given = True
        return self.rows


def _shown(app: TopApp) -> list[str]:
    table = app.query_one("#processes")
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]  # type: ignore[attr-defined]


def test_the_screen_sorts_filters_and_opens_details() -> None:
    async def scenario() -> None:
        feed = _Feed(ROWS)
        app = TopApp(feed.next_rows, "rows made up here")
        async with app.run_test(size=(200, 30)) as pilot:
            while not app.rows:
                await pilot.pause()
            assert _shown(app) == ["2", "3", "1"]
            await pilot.press("s")  # the next column after LAUNCH/S: BLOCKS/L
            assert app.key == KEYS[KEYS.index("launches_per_s") + 1]
            await pilot.press("S", "S")
            assert app.key == "job"
            await pilot.press("slash", *"webs", "enter")  # typed keys are the filter's
            assert app.text == "webs" and app.key == "job" and _shown(app) == []
            await pilot.press("slash", "backspace", "enter")
            assert app.text == "web" and _shown(app) == ["3"]
            await pilot.press("slash", "ctrl+u", "enter")  # an empty filter clears it
            assert app.text == "" and len(_shown(app)) == 3
            await pilot.press("enter")
            assert isinstance(app.screen, DetailScreen)
            await pilot.press("escape")
            assert not isinstance(app.screen, DetailScreen)
            await pilot.press("q")
        assert app.return_value is None

    asyncio.run(scenario())


def test_keys_that_arrive_at_once_all_reach_the_filter() -> None:
    # A paste, or tmux's send-keys: `/` and what follows it are queued together. The keys after
    # `/` went to the table while `/` travelled up from it (the first letters were lost), and
    # a `/` typed in the box is text (namespace/pod), not a new filter.
    from textual import events

    async def scenario() -> None:
        feed = _Feed(ROWS)
        app = TopApp(feed.next_rows, "rows made up here")
        async with app.run_test(size=(200, 30)) as pilot:
            while not app.rows:
                await pilot.pause()
            for key, char in [("slash", "/"), *((c, c) for c in "ml"), ("slash", "/"),
                              *((c, c) for c in "tr"), ("enter", "\r")]:
                app.post_message(events.Key(key, char))
            for _ in range(200):  # until the Enter was handled (or long after)
                if app.text:
                    break
                await pilot.pause()
            assert app.text == "ml/tr" and _shown(app) == ["2"]
            await pilot.press("q")

    asyncio.run(scenario())


def test_a_process_details_follow_each_interval_and_say_when_it_is_gone() -> None:
    intervals = [ROWS, [_row(2, 900, pod="ml/trainer-0",
                             kernels=(KernelRow("gemm", 900, 1.0),))], [ROWS[0]]]
    asked = threading.Semaphore(0)
    never = threading.Event()

    def next_rows() -> list[ProcessRow]:
        asked.acquire()
        if not intervals:
            never.wait()
        return intervals.pop(0)

    def cells(app: TopApp, table: str) -> list[str]:
        t = app.screen.query_one(table)
        return [str(t.get_row_at(i)[0]) for i in range(t.row_count)]  # type: ignore[attr-defined]

    async def scenario() -> None:
        app = TopApp(next_rows, "rows made up here")
        async with app.run_test(size=(200, 30)) as pilot:
            asked.release()
            while not app.rows:
                await pilot.pause()
            await pilot.press("enter")  # the first row: pid 2
            assert isinstance(app.screen, DetailScreen) and cells(app, "#kernels") == ["axpy"]
            asked.release()
            while cells(app, "#kernels") != ["gemm"]:
                await pilot.pause()
            asked.release()  # an interval without pid 2
            while cells(app, "#kernels"):
                await pilot.pause()
            who = str(app.screen.query_one("#who").render())
            assert "pid 2" in who and "not seen this interval" in who
            await pilot.press("q")

    asyncio.run(scenario())


def test_a_source_that_fails_ends_the_screen_with_its_reason() -> None:
    def broken() -> list[ProcessRow]:
        raise OSError("the node agent's feed closed")

    async def scenario() -> None:
        app = TopApp(broken, "a feed")
        async with app.run_test(size=(200, 30)) as pilot:
            while app.return_value is None and app.is_running:
                await pilot.pause()
        assert app.return_value == "the node agent's feed closed"

    asyncio.run(scenario())


def test_top_without_a_terminal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["top"]) == 2  # pytest's stdin and stdout are no terminal
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpuflight: error: top needs a terminal; for scripts: --once or --json"]


def test_trace_top_without_a_terminal_is_one_line_before_the_command_runs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    assert cli.main(["trace", "--top", "--", "touch", str(ran)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpuflight: error: trace --top needs a terminal; without a terminal, trace "
                   "without --top"]
    assert cli.main(["trace", "--command-output", str(tmp_path / "o"), "--", "touch",
                     str(ran)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpuflight: error: --command-output goes with --top (without it the "
                   "command's output is yours: redirect it)"]
    assert not ran.exists()


def test_names_are_shown_as_they_are_never_as_markup() -> None:
    # Any user names their process: `[/]` raised Rich's MarkupError (root's top crashed), and
    # `[id]` in a route vanished.
    from rich.console import Console

    odd = [_row(7, 5.0, command="[/]", job="[bold]x", routes=(RouteRow("/api/[id]", 1.0,
                                                                         None),))]
    console = Console(width=400, record=True)
    console.print(plain_table(odd, "launches_per_s"))
    text = console.export_text()
    assert "[/]" in text and "[bold]x" in text

    async def scenario() -> None:
        feed = _Feed(odd)
        app = TopApp(feed.next_rows, "a [red]source")
        async with app.run_test(size=(200, 30)) as pilot:
            while not app.rows:
                await pilot.pause()
            table = app.query_one("#processes")
            assert str(table.get_row_at(0)[1]) == "[/]"  # type: ignore[attr-defined]
            assert "a [red]source" in str(app.query_one("#status").render())
            await pilot.press("enter")
            routes = app.screen.query_one("#routes")
            assert str(routes.get_row_at(0)[0]) == "/api/[id]"  # type: ignore[attr-defined]
            await pilot.press("q")

    asyncio.run(scenario())


def test_a_stop_while_a_line_is_written_comes_after_the_line() -> None:
    import os
    import signal

    from gpuflight.commands import top

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    # Another thread, as top's capture has: the kernel may give it the signal; CPython runs
    # the handler in the main thread all the same, wherever that is.
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, daemon=True)
    other.start()
    try:
        top._stop_on_signals()
        written = []
        with pytest.raises(top._Stopped) as stopped, top._signals_held():
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, in this thread
            written.append("the rest of the line")
        assert written == ["the rest of the line"] and stopped.value.signum == signal.SIGTERM
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # a second one is ignored
    finally:
        idle.set()
        for sig, handler in saved.items():
            signal.signal(sig, handler)
