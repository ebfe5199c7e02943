"""`gpuflight top`'s columns: what each shows and how, how rows sort and filter, and the plain
table of `--once` (rich) — the same for the live screen (gpuflight/topscreen.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from rich.table import Table

    from gpuflight.producer.toptable import ProcessRow


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    format: Callable[[Any], str]
    #: Sort descending (rates: the busiest first) or ascending (names).
    descending: bool = True


def _num(digits: int) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else f"{v:,.{digits}f}"


def _text(v: Any) -> str:
    return "-" if v in (None, "") else str(v)


def _devices(v: Any) -> str:
    return ",".join(str(d) for d in v) if v else "-"


COLUMNS: Final = (
    Column("pid", "PID", _text, descending=False),
    Column("command", "COMMAND", _text, descending=False),
    Column("pod", "POD", _text, descending=False),
    Column("job", "JOB", _text, descending=False),
    Column("launches_per_s", "LAUNCH/S", _num(0)),
    Column("blocks_per_launch", "BLOCKS/L", _num(0)),
    Column("top_kernel", "TOP KERNEL", _text, descending=False),
    Column("h2d_gb_per_s", "H2D GB/S", _num(2)),
    Column("d2h_gb_per_s", "D2H GB/S", _num(2)),
    Column("blocked_pct", "BLOCKED%", _num(1)),
    Column("gpu_s_per_s", "GPU-S/S", _num(2)),
    Column("usd_per_h", "$/H", _num(2)),
    Column("requests_per_s", "REQ/S", _num(1)),
    Column("p99_ms", "P99 MS", _num(1)),
    Column("devices", "GPU", _devices, descending=False),
)
KEYS: Final = tuple(c.key for c in COLUMNS)
#: The smallest terminal the screens fit in.
MIN_COLUMNS, MIN_LINES = 80, 12


def sorted_rows(rows: Sequence[ProcessRow], key: str, text: str = "") -> list[ProcessRow]:
    """`rows` whose pod, job or command holds `text`, sorted by column `key` (numbers the
    largest first; missing values last)."""
    column = next(c for c in COLUMNS if c.key == key)
    wanted = text.lower()
    kept = [r for r in rows if not wanted or any(
        wanted in str(v).lower() for v in (r.pod, r.job, r.command, r.container))]
    present = [r for r in kept if getattr(r, key) is not None]
    missing = [r for r in kept if getattr(r, key) is None]
    present.sort(key=lambda r: (getattr(r, key), -r.pid if column.descending else r.pid),
                 reverse=column.descending)
    return present + missing


def plain_table(rows: Sequence[ProcessRow], key: str = "launches_per_s", text: str = "",
                title: str | None = None) -> Table:
    """The table of `--once`: the same columns and order as the screen."""
    from rich.table import Table
    from rich.text import Text

    # Text, not str: Rich reads a str as markup, and names come from other users' processes
    # (a command named `[/]` raised MarkupError; a route `/api/[id]` lost its `[id]`).
    table = Table(title=None if title is None else Text(title), box=None, pad_edge=False,
                  header_style="bold")
    for column in COLUMNS:
        table.add_column(column.title + (" ▼" if column.key == key else ""),
                         justify="left" if not column.descending else "right",
                         overflow="ellipsis", no_wrap=True)
    for row in sorted_rows(rows, key, text):
        table.add_row(*(Text(c.format(getattr(row, c.key))) for c in COLUMNS))
    return table
