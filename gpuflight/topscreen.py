"""`gpuflight top`'s screens (textual): the node's processes, refreshed every interval, sortable
and filterable; a second screen with one process's top kernels, shapes and routes.

Keys: `s`/`S` sort by the next/previous column (the header marks it, ▼), `/` filter by pod,
namespace, job or command (Enter applies, an empty filter clears), Enter a row's details
(Escape back), `q` quit. The columns are gpuflight/topcolumns.py's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from gpuflight.producer.top import FeedEnded
from gpuflight.producer.toptable import ProcessRow
from gpuflight.topcolumns import COLUMNS, KEYS, sorted_rows


class DetailScreen(Screen[None]):
    """One process: its top kernels, launch shapes and routes over the last interval, refreshed
    with each interval's rows (and marked when the process is gone)."""

    BINDINGS: ClassVar = [Binding("escape", "app.pop_screen", "back"),
                          Binding("q", "app.quit", "quit")]

    def __init__(self, row: ProcessRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        yield Static(id="who")
        yield DataTable(id="kernels")
        yield DataTable(id="shapes")
        yield DataTable(id="routes")
        yield Footer()

    def on_mount(self) -> None:
        self.show(self.row)

    def show(self, row: ProcessRow | None) -> None:
        """This interval's figures of the process (None: it is not in this interval's rows)."""
        r = row or self.row
        self.row = r
        self.query_one("#who", Static).update(Text(
            f"pid {r.pid}  {r.command}  pod {r.pod}  job {r.job}  container {r.container}"
            + ("" if row is not None else "  — not seen this interval (exited, or idle)")))
        kernels: DataTable[Text | str] = self.query_one("#kernels", DataTable)
        kernels.clear(columns=True)
        kernels.add_columns("KERNEL", "LAUNCH/S", "SHARE%")
        for k in r.kernels if row is not None else ():
            kernels.add_row(Text(k.name), f"{k.launches_per_s:,.0f}", f"{100 * k.share:.1f}")
        shapes: DataTable[Text | str] = self.query_one("#shapes", DataTable)
        shapes.clear(columns=True)
        shapes.add_columns("GRID", "BLOCK", "LAUNCH/S")
        for s in r.shapes if row is not None else ():
            shapes.add_row(Text(s.grid), Text(s.block), f"{s.launches_per_s:,.0f}")
        routes: DataTable[Text | str] = self.query_one("#routes", DataTable)
        routes.clear(columns=True)
        routes.add_columns("ROUTE", "REQ/S", "P99 MS")
        for x in r.routes if row is not None else ():
            routes.add_row(Text(x.route), f"{x.requests_per_s:,.1f}",
                           "-" if x.p99_ms is None else f"{x.p99_ms:,.1f}")


class TopApp(App[str | None]):
    """The live table; `next_rows` (blocking) gives each interval's rows. Exits with the
    failure's text when the source fails (None when the user quits)."""

    CSS = "DataTable { height: 1fr; } #filter { display: none; } #filter.shown { display: block; }"
    BINDINGS: ClassVar = [
        Binding("q", "quit", "quit"),
        Binding("s", "sort(1)", "sort →"),
        Binding("S", "sort(-1)", "sort ←"),
        # Priority: handled as it arrives, before the keys after it are passed on (else they
        # go to the table while `/` travels up from it: a paste or tmux's send-keys lost them).
        Binding("slash", "filter", "filter", priority=True),
        Binding("enter", "details", "details"),
    ]

    def __init__(self, next_rows: Callable[[], list[ProcessRow]], source: str,
                 key: str = "launches_per_s", text: str = "") -> None:
        super().__init__()
        self._next_rows = next_rows
        self._source = source
        self.key = key
        self.text = text
        self.rows: list[ProcessRow] = []
        self._shown: list[ProcessRow] = []
        self._stopping = threading.Event()

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield Input(placeholder="filter: pod, namespace, job or command", id="filter",
                    select_on_focus=False)
        yield DataTable(id="processes", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self._show()
        self.query_one("#processes", DataTable).focus()  # not the (hidden) filter box
        # A thread of its own, not a textual worker: quitting must not wait for a source
        # blocked in its read (an agent's feed that went quiet).
        threading.Thread(target=self._refresh_rows, name="gf-top-rows", daemon=True).start()

    def _refresh_rows(self) -> None:
        while not self._stopping.is_set():
            try:
                rows = self._next_rows()
            except FeedEnded:  # what it showed is over (`trace --top`: the command exited)
                self._from_thread(self.exit, None)
                return
            except Exception as exc:
                self._from_thread(self.exit, str(exc))
                return
            self._from_thread(self._update, rows)

    def _from_thread(self, call: Callable[..., object], *args: object) -> None:
        if self._stopping.is_set():
            return
        try:
            self.call_from_thread(call, *args)
        except RuntimeError:  # the app is gone meanwhile
            self._stopping.set()

    def _update(self, rows: list[ProcessRow]) -> None:
        self.rows = rows
        self._show()
        if isinstance(self.screen, DetailScreen):
            pid = self.screen.row.pid
            self.screen.show(next((r for r in rows if r.pid == pid), None))

    def _show(self) -> None:
        table: DataTable[Text | str] = self.query_one("#processes", DataTable)
        cursor = table.cursor_row
        table.clear(columns=True)
        for column in COLUMNS:
            table.add_column(column.title + (" ▼" if column.key == self.key else ""),
                             key=column.key)
        self._shown = sorted_rows(self.rows, self.key, self.text)
        for row in self._shown:
            table.add_row(*(Text(c.format(getattr(row, c.key))) for c in COLUMNS),
                          key=str(row.pid))
        if self._shown:
            table.move_cursor(row=min(cursor, len(self._shown) - 1))
        status = self.query_one("#status", Static)
        by = next(c.title for c in COLUMNS if c.key == self.key)
        status.update(Text(  # not markup: names and the filter are anyone's text
            f"gpuflight top — {len(self._shown)} of {len(self.rows)} processes, sorted by {by}"
            + (f", filter '{self.text}'" if self.text else "") + f" — from {self._source}"))

    def action_sort(self, step: int) -> None:
        self.key = KEYS[(KEYS.index(self.key) + step) % len(KEYS)]
        self._show()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.value = self.text
        box.cursor_position = len(self.text)
        self.screen.set_focus(box)  # at once: the keys after `/` are passed on next

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`/` typed in the filter box is text (a pod's namespace/name), not a new filter."""
        return not (action == "filter" and isinstance(self.focused, Input))

    def on_input_submitted(self, message: Input.Submitted) -> None:
        self.text = message.value.strip()
        message.input.remove_class("shown")
        self.query_one("#processes", DataTable).focus()
        self._show()

    def action_details(self) -> None:
        table: DataTable[Text | str] = self.query_one("#processes", DataTable)
        if self._shown and 0 <= table.cursor_row < len(self._shown):
            self.push_screen(DetailScreen(self._shown[table.cursor_row]))

    def on_data_table_row_selected(self, message: DataTable.RowSelected) -> None:
        if message.data_table.id == "processes":
            self.action_details()

    async def action_quit(self) -> None:
        self._stopping.set()
        self.exit(None)
