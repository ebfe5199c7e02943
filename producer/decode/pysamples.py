"""The in-kernel walk's samples (bpf/pywalk.bpf.h) → code paths: each stack symbolised once,
when its frames arrive (ring `py_frames`, before its first sample's head) — the process may
be gone by the end of a trace — and each sample's head (ring `py_samples`) joined to the event
of the call it sampled, which the head names exactly (pid, tid and the event's time). A path
gets what its sampled calls cost (producer/contract/costs.py, the model that prices requests),
each weighted by the calls the sample stands for: kernel launches, GPU time, bytes copied, CPU
time blocked, calls. A call's event may come before its head (launches: the walk runs after
the event is sent, in the same program) or after it (a sync's event is sent when it returns):
a head read finds its event among the events priced in this turn and the last, or waits for
it, bounded; a head whose event never comes (the events ring was full) counts as calls alone,
and is counted.

A code object is read once per (pid, address), and revalidated when a new stack holds that
address again: its name, file and first line's pointers are read back (one read) and compared,
so that an address a freed code object left and a new one took is not given the old name.

GPU time per call is the busy-span model of costs.busy_gpu_ns over the whole stream: a
process's events are held until its next drain (a sync, a synchronous copy) and priced then,
so a busy span read over several turns is split over all of its work; a process that holds
MAX_HELD_EVENTS without a drain has its span cut there. Events shed under overload (only
counted) are not sampled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import (
    PY_BACKWARD,
    PY_NEW,
    PY_NO_PYTHON,
    PY_NO_THREAD,
    PY_TRUNCATED,
    py_head_dtype,
    py_stack_dtype,
)
from gpuflight.producer.contract.costs import COST_FIELDS, FIELD, drains, event_costs
from gpuflight.producer.decode.codepaths import PathFrame, PathSample
from gpuflight.producer.decode.pystacks import (
    CodeInfo,
    Memory,
    MemoryReadError,
    code_info,
    locate,
)
from gpuflight.producer.discover.pythons import PyLayout
from gpuflight.producer.http.attribution import CallSet, CallShares

log = logging.getLogger(__name__)

#: Flags of a sample (bpf/pywalk.bpf.h).
TRUNCATED: Final = PY_TRUNCATED
NO_THREAD: Final = PY_NO_THREAD
NEW: Final = PY_NEW
NO_PYTHON: Final = PY_NO_PYTHON
BACKWARD: Final = PY_BACKWARD
#: Sampled calls kept while their events are not read yet (beyond, the oldest count as calls
#: alone: `unjoined`).
MAX_UNJOINED: Final = 100_000
#: The most events a process's busy span is held for before it is priced anyway (cut there).
MAX_HELD_EVENTS: Final = 200_000
#: The frame a truncated stack is rooted at, and the one of a thread not running Python.
CUT: Final = PathFrame("[truncated]", "", None)
NO_FRAMES: Final = PathFrame("[no Python frames]", "", None)
#: Between the stack that entered PyTorch's autograd engine and the native caller of a call
#: one of the engine's threads made for that backward pass (BACKWARD).
IN_BACKWARD: Final = PathFrame("[autograd backward]", "", None)
UNKNOWN: Final = PathFrame("[unknown code]", "", None)
#: The one frame of a stack whose frames never came.
UNKNOWN_STACK: Final = PathFrame("[unknown stack]", "", None)
#: A trace's path value (not published): the variance of its launches' estimate.
LAUNCHES_VARIANCE: Final = "launches_variance"
#: The longest function or file name a path published carries.
MAX_TEXT: Final = wire.MAX_FRAME_TEXT
#: A path's values: COST_FIELDS, the calls its samples stand for, and Σ w(w-1) over its
#: samples' launches (w: a sample's weight): the variance of its launches' estimate.
_CALLS: Final = len(COST_FIELDS)
_LAUNCH_VAR: Final = _CALLS + 1
_WIDTH: Final = _CALLS + 2
_COPIES: Final = [FIELD[f] for f in ("h2d_bytes", "d2h_bytes", "d2d_bytes", "other_copy_bytes")]
#: Requests whose sampled calls' paths are kept for their spans, until taken (beyond: the
#: oldest are dropped, counted in `request_paths_dropped`).
MAX_REQUESTS_KEPT: Final = 100_000
#: A share of a call's cost this small is no route's.
_NO_SHARE: Final = 1e-9
I64 = npt.NDArray[np.int64]


def head_dtype() -> np.dtype[np.void]:
    return py_head_dtype()


def stack_dtype(max_depth: int) -> np.dtype[np.void]:
    return py_stack_dtype(max_depth)


@dataclass
class _Code:
    fingerprint: bytes
    info: CodeInfo


class StackSamples:
    """Samples in, code paths out. `memory(pid)` opens a process's memory (None: gone);
    `layout(pid)` is the process's layout (what its offsets in the kernel came from);
    `clock_offset_ns` turns a head's time into its (enriched) event's."""

    def __init__(self, max_depth: int, memory: Callable[[int], Memory | None],
                 layout: Callable[[int], PyLayout | None], clock_offset_ns: int = 0,
                 native: Callable[[int, int], PathFrame | None] | None = None) -> None:
        self._native = native
        self._head = head_dtype()
        self._whole = stack_dtype(max_depth)
        self._memory = memory
        self._layout = layout
        self._offset = clock_offset_ns
        self._codes: dict[tuple[int, int], _Code] = {}
        #: Each stack's frames, root first (once they came), and each process's stacks.
        self._frames: dict[int, tuple[PathFrame, ...]] = {}
        self._stacks_of: dict[int, set[int]] = {}
        #: Each stack's values (COST_FIELDS, calls) and its heads, for `samples` (a trace's
        #: end; not kept once `publish` is on: the node agent runs for ever).
        self._values: dict[int, npt.NDArray[np.float64]] = {}
        self._heads: dict[int, int] = {}
        #: (pid, tid, event time) → (stack, weight): sampled calls whose event is not priced.
        self._pending: dict[tuple[int, int, int], tuple[int, float]] = {}
        #: Each process's events since its last drain (a sync, a synchronous copy): not priced
        #: until that busy span ends, so that its GPU time is split over all of its work.
        self._held: dict[int, list[npt.NDArray[np.void]]] = {}
        self._held_events: dict[int, int] = {}
        #: Beside each held part: what each event was made for (a key of `_calls`; 0: no
        #: request).
        self._held_calls: dict[int, list[I64]] = {}
        #: The requests events were made for, by key (each batch's get keys of their own,
        #: dropped once no event kept has them: `end_turn`).
        self._calls: dict[int, CallSet] = {}
        self._next_call = 1
        #: Keep what each request's sampled calls cost, for its span (`take_request_paths`).
        self.per_request = False
        #: Per request (its span), what each stack's sampled calls made for it cost, until
        #: `take_request_paths`.
        self._by_request: dict[int, dict[int, npt.NDArray[np.float64]]] = {}
        #: Requests whose paths were dropped untaken (MAX_REQUESTS_KEPT).
        self.request_paths_dropped = 0
        #: Events priced in this turn and the turn before, with their costs and what they were
        #: made for, for heads read after their event.
        self._priced: list[tuple[npt.NDArray[np.void], npt.NDArray[np.float64], I64]] = []
        self._priced_before: list[
            tuple[npt.NDArray[np.void], npt.NDArray[np.float64], I64]] = []
        #: What each (pid, stack, route) cost since `take_paths` (when the capture publishes),
        #: and the latest of its sampled calls; None: nobody takes them.
        self._fresh: dict[tuple[int, int, str | None],
                          tuple[npt.NDArray[np.float64], int]] | None = None
        #: Paths of processes forgotten since the last take (their frames are gone since).
        self._forgotten: dict[int, list[wire.PathRecord]] = {}
        #: Samples of stacks whose frames never came (lost to a full ring): counted here.
        self.unknown_stacks = 0
        #: Sampled calls whose event never came: counted as calls alone.
        self.unjoined = 0

    def add_frames(self, records: Any) -> None:
        """Records of `py_frames` (a stack's first sample, with its frames): symbolised now."""
        for whole in np.atleast_1d(records):
            stack_id = int(whole["stack_id"])
            if stack_id not in self._frames:
                self._frames[stack_id] = self._symbolise(whole)
                self._stacks_of.setdefault(int(whole["pid"]), set()).add(stack_id)

    def read_codes(self, records: Any) -> None:
        """Records of `py_frames` just out of the ring: their code objects read now, while
        their processes live (`add_frames` names the stacks from them later)."""
        for whole in np.atleast_1d(records):
            pid, depth = int(whole["pid"]), int(whole["depth"])
            if int(whole["flags"]) & (NO_THREAD | NO_PYTHON):
                continue
            layout = self._layout(pid)
            memory = self._memory(pid) if layout is not None else None
            if layout is None or memory is None:
                continue
            for code in whole["code"][:depth].tolist():
                if code:
                    self._code(memory, layout, pid, int(code))

    def add_samples(self, heads: Any) -> None:
        """Records of `py_samples` (every sample's head): each finds its call's event among
        those priced in this turn and the last, or waits for it."""
        heads = np.atleast_1d(heads)
        if len(heads) == 0:
            return
        # Column by column (every-call walking sends ~100,000 heads a second): a head's
        # fields one by one from numpy cost ~4 us, and the samples' ring filled meanwhile.
        stack_ids = heads["stack_id"].tolist()
        if self._fresh is None:
            ids, counts = np.unique(heads["stack_id"], return_counts=True)
            for stack_id, count in zip(ids.tolist(), counts.tolist(), strict=True):
                self._heads[stack_id] = self._heads.get(stack_id, 0) + count
        offset = self._offset
        keys = dict(zip(zip(heads["pid"].tolist(), heads["tid"].tolist(),
                            [ts + offset for ts in heads["ts_ns"].tolist()], strict=True),
                        zip(stack_ids, heads["weight"].astype(np.float64).tolist(),
                            strict=True), strict=True))
        for events, costs, calls in (*self._priced_before, *self._priced):
            if not keys:
                break
            self._join(events, costs, calls, keys)
        self._pending.update(keys)
        while len(self._pending) > MAX_UNJOINED:
            oldest = next(iter(self._pending))
            self._unjoined(oldest, *self._pending.pop(oldest))

    def add_events(self, events: npt.NDArray[np.void], calls: CallShares | None = None) -> None:
        """A batch of enriched events (records.EVENT_DTYPE), in ring order: each process's
        are held until its next drain, then priced (costs.event_costs over the whole busy
        span), and the sampled calls among them give their paths what they cost. `calls`: the
        requests each event was made for, with their routes (HTTP captured): a published path
        is then per route, and each request gets its calls' paths (`take_request_paths`)."""
        if len(events) == 0:
            return
        keys = np.zeros(len(events), dtype=np.int64)
        if calls is not None and len(calls.sets) > 1:
            first = self._next_call
            self._calls.update(enumerate(calls.sets[1:], start=first))
            self._next_call += len(calls.sets) - 1
            keys = np.where(calls.keys > 0, calls.keys + (first - 1), 0)
        pids = events["pid"]
        unique = np.unique(pids).tolist()
        for pid in unique:
            mine = None if len(unique) == 1 else pids == pid
            part = events if mine is None else events[mine]
            self._held.setdefault(pid, []).append(part)
            self._held_calls.setdefault(pid, []).append(keys if mine is None else keys[mine])
            self._held_events[pid] = self._held_events.get(pid, 0) + len(part)
            last = np.flatnonzero(drains(part))
            if len(last) or self._held_events[pid] >= MAX_HELD_EVENTS:
                # Up to the last drain; past the bound, all of it (the span is cut there).
                self._price(pid, len(part) - 1 - int(last[-1]) if len(last) else 0)

    def end_turn(self) -> None:
        """A turn's events and heads are read: events priced the turn before are kept no
        longer (a call's head is sent right after its event, in the same program), nor what
        no event kept was made for."""
        self._priced_before, self._priced = self._priced, []
        if self._calls:
            kept = [keys for parts in self._held_calls.values() for keys in parts]
            kept += [keys for _, _, keys in self._priced_before]
            floor = min((int(k[k > 0].min()) for k in kept if k.any()), default=self._next_call)
            for key in [k for k in self._calls if k < floor]:  # oldest first, as added
                del self._calls[key]

    def settle(self, pids: Iterable[int] | None = None) -> None:
        """Price what `pids` (default: every process) hold now: their busy spans end at their
        last event (at the end of a capture; a process gone)."""
        for pid in list(self._held if pids is None else pids):
            if pid in self._held:
                self._price(pid, 0)

    def _price(self, pid: int, keep: int) -> None:
        """Price `pid`'s held events but the last `keep` (held on)."""
        parts = self._held.pop(pid)
        held = parts[0] if len(parts) == 1 else np.concatenate(parts)
        call_parts = self._held_calls.pop(pid)
        calls = call_parts[0] if len(call_parts) == 1 else np.concatenate(call_parts)
        self._held_events.pop(pid)
        if keep:
            self._held[pid] = [held[len(held) - keep:]]
            self._held_calls[pid] = [calls[len(calls) - keep:]]
            self._held_events[pid] = keep
            held, calls = held[:len(held) - keep], calls[:len(calls) - keep]
        costs = event_costs(held)  # one process, whole busy spans
        self._priced.append((held, costs, calls))
        if self._pending:
            self._join(held, costs, calls, self._pending)

    def _join(self, events: npt.NDArray[np.void], costs: npt.NDArray[np.float64], calls: I64,
              waiting: dict[tuple[int, int, int], tuple[int, float]]) -> None:
        """The events of `waiting`'s calls among `events` (one process's, priced: `costs`;
        what they were made for: `calls`) give their paths what they cost, times their weight,
        split over their requests' routes, and to each request its share (found ones leave
        `waiting`)."""
        ts = events["ts_ns"]
        times = np.fromiter((key[2] for key in waiting), dtype=np.uint64, count=len(waiting))
        near = np.flatnonzero(np.isin(ts, times))
        if len(near) == 0:
            return
        found: list[int] = []
        hits: list[tuple[int, int, int, float]] = []  # (pid, ts_ns, stack_id, weight)
        for i, key in zip(near.tolist(), zip(events["pid"][near].tolist(),
                                             events["tid"][near].tolist(), ts[near].tolist(),
                                             strict=True), strict=True):
            hit = waiting.pop(key, None)
            if hit is not None:
                found.append(i)
                hits.append((key[0], key[2], *hit))
        if not found:
            return
        at = np.array(found)
        weights = np.array([hit[3] for hit in hits])
        rows = np.empty((len(found), _WIDTH))
        rows[:, :_CALLS] = weights[:, None] * costs[at]
        rows[:, _CALLS] = weights
        rows[:, _LAUNCH_VAR] = weights * (weights - 1) * costs[at, FIELD["launches"]]
        made_for = calls[at]
        if self.per_request or made_for.any():
            for n, (pid, ts_ns, stack_id, _) in enumerate(hits):
                # A row of its own: a path may keep the row it is given (`_add`), and a view
                # would keep this whole batch's rows with it until the path is taken.
                self._add_call(pid, stack_id, rows[n].copy(), ts_ns,
                               self._calls.get(int(made_for[n]), ()))
            return
        # Made for no request: each (process, stack)'s calls at once, summed.
        by_stack: dict[tuple[int, int], list[int]] = {}
        for n, (pid, _, stack_id, _) in enumerate(hits):
            by_stack.setdefault((pid, stack_id), []).append(n)
        for (pid, stack_id), ns in by_stack.items():
            self._add(pid, stack_id, None, rows[ns].sum(axis=0),
                      max(hits[n][1] for n in ns))

    def _add_call(self, pid: int, stack_id: int, row: npt.NDArray[np.float64], ts_ns: int,
                  made_for: CallSet) -> None:
        """A sampled call's cost (`row`), to its stack, and when HTTP is captured to the
        requests it was made for (their spans) and to its path per route (when publishing)."""
        if self.per_request:
            for rid, _, share in made_for:
                self._for_request(rid, stack_id, row * share)
        by_route: dict[str, float] = {}
        if self._fresh is not None:  # a trace's paths are per stack alone
            for _, route, share in made_for:
                if route:
                    by_route[route] = by_route.get(route, 0.0) + share
        rest = 1.0
        for route, share in sorted(by_route.items()):
            self._add(pid, stack_id, route, row * share, ts_ns)
            rest -= share
        if rest > _NO_SHARE:
            self._add(pid, stack_id, None, row if rest == 1.0 else row * rest, ts_ns)

    def _for_request(self, rid: int, stack_id: int, row: npt.NDArray[np.float64]) -> None:
        stacks = self._by_request.get(rid)
        if stacks is None:
            if len(self._by_request) >= MAX_REQUESTS_KEPT:
                del self._by_request[next(iter(self._by_request))]
                self.request_paths_dropped += 1
            stacks = self._by_request[rid] = {}
        was = stacks.get(stack_id)
        stacks[stack_id] = row if was is None else was + row

    def take_request_paths(self, rid: int) -> list[PathSample]:
        """The code paths of the sampled calls made for request `rid` so far (its share of
        shared ones), with what they cost; forgotten here once taken."""
        stacks = self._by_request.pop(rid, None)
        if not stacks:
            return []
        return [PathSample(self._frames.get(stack_id, (UNKNOWN_STACK,)), _named(values))
                for stack_id, values in stacks.items()]

    def _add(self, pid: int, stack_id: int, route: str | None, row: npt.NDArray[np.float64],
             ts_ns: int) -> None:
        if self._fresh is None:
            self._stack_values(stack_id)[:] += row
            return
        was = self._fresh.get((pid, stack_id, route))
        if was is not None:
            row = row + was[0]
            ts_ns = max(ts_ns, was[1])
        self._fresh[pid, stack_id, route] = (row, ts_ns)

    def add(self, raw: bytes) -> None:
        """One record of either ring, told apart by its size."""
        if len(raw) >= self._whole.itemsize:
            self.add_frames(np.frombuffer(raw, self._whole, count=1))
        else:
            self.add_samples(np.frombuffer(raw, self._head, count=1))

    def samples(self, usd_per_gpu_hour: float | None = None) -> list[PathSample]:
        """The code paths so far, priced at `usd_per_gpu_hour` where given (cost in
        microdollars); sampled calls whose event never came count as calls alone (call at the
        end, once every ring is read)."""
        self.finish()
        self.unknown_stacks = sum(n for stack_id, n in self._heads.items()
                                  if stack_id not in self._frames)
        out = []
        for stack_id, values in self._values.items():
            frames = self._frames.get(stack_id)
            if frames is None:
                continue
            named = _named(values)
            named[LAUNCHES_VARIANCE] = float(values[_LAUNCH_VAR])
            if usd_per_gpu_hour is not None:
                named["cost"] = named["gpu_ns"] / 1e9 / 3600 * usd_per_gpu_hour * 1e6
            out.append(PathSample(frames, named))
        return out

    @property
    def walks(self) -> int:
        """Samples read (stacks walked), when not publishing."""
        return sum(self._heads.values())

    def finish(self) -> None:
        """At the end of a capture, every ring read: what is held is priced, and sampled calls
        whose event never came count as calls alone."""
        self.settle()
        for key, (stack_id, weight) in self._pending.items():
            self._unjoined(key, stack_id, weight)
        self._pending.clear()

    def publish(self) -> None:
        """From now on, what each process's paths cost is kept for `take_paths` instead (and
        a process's stacks are forgotten with it)."""
        if self._fresh is None:
            self._fresh = {}

    def take_paths(self) -> dict[int, list[wire.PathRecord]]:
        """Per process, the code paths of the calls priced since the last take, with what
        they cost (a stack whose frames never came is one frame that says so)."""
        out, self._forgotten = self._forgotten, {}
        if not self._fresh:
            return out
        fresh, self._fresh = self._fresh, {}
        for (pid, stack_id, route), (values, ts_ns) in fresh.items():
            out.setdefault(pid, []).append(self._record(stack_id, values, ts_ns, route))
        return out

    def forget(self, pid: int) -> None:
        """A process exited (its events all read): its held events are priced, and, when
        publishing, its paths taken at the next `take_paths` and its stacks forgotten. Its
        code objects' addresses mean nothing any more."""
        for key in [k for k in self._codes if k[0] == pid]:
            del self._codes[key]
        if self._fresh is None:
            return
        self.settle([pid])
        for waiting in [k for k in self._pending if k[0] == pid]:
            self._unjoined(waiting, *self._pending.pop(waiting))
        for path in [k for k in self._fresh if k[0] == pid]:
            values, ts_ns = self._fresh.pop(path)
            self._forgotten.setdefault(pid, []).append(
                self._record(path[1], values, ts_ns, path[2]))
        for stack_id in self._stacks_of.pop(pid, ()):
            self._frames.pop(stack_id, None)

    def _record(self, stack_id: int, values: npt.NDArray[np.float64],
                ts_ns: int, route: str | None) -> wire.PathRecord:
        frames = self._frames.get(stack_id, (UNKNOWN_STACK,))
        return wire.PathRecord(
            ts_ns, tuple((f.function[:MAX_TEXT], f.file[:MAX_TEXT], _line(f.line))
                         for f in frames[-wire.MAX_PATH_FRAMES:]),
            {name: value for name, value in _named(values).items() if value}, route)

    def _stack_values(self, stack_id: int) -> npt.NDArray[np.float64]:
        values = self._values.get(stack_id)
        if values is None:
            values = self._values[stack_id] = np.zeros(_WIDTH)
        return values

    def _unjoined(self, key: tuple[int, int, int], stack_id: int, weight: float) -> None:
        """A sampled call (pid, tid, time) whose event never came: its calls alone."""
        row = np.zeros(_WIDTH)
        row[_CALLS] = weight
        self._add(key[0], stack_id, None, row, key[2])
        self.unjoined += 1

    def _symbolise(self, whole: Any) -> tuple[PathFrame, ...]:
        """The stack's frames, root first: its Python frames, then the call's native caller
        (the code the probed call returns to: `libtorch_cuda.so!at::native::…`, libffi's for
        ctypes) where `native` names it."""
        pid, flags, depth = int(whole["pid"]), int(whole["flags"]), int(whole["depth"])
        caller = int(whole["caller"])
        native = self._native(pid, caller) if self._native is not None and caller else None
        if flags & NO_PYTHON and native is not None:
            return (native,)
        if flags & (NO_THREAD | NO_PYTHON) or (not depth and not flags & TRUNCATED):
            # A thread not running Python (or one whose state has no frame: autograd's
            # device threads while no backward pass is known to be running).
            return (NO_FRAMES,) if native is None else (NO_FRAMES, native)
        layout = self._layout(pid)
        memory = self._memory(pid) if layout is not None else None
        frames: list[PathFrame] = [] if native is None else [native]
        if flags & BACKWARD:
            frames.append(IN_BACKWARD)
        for code, instr in zip(whole["code"][:depth], whole["instr"][:depth], strict=True):
            if not code:  # a shim frame (owned by the C stack)
                continue
            if layout is None or memory is None:
                frames.append(UNKNOWN)
                continue
            info = self._code(memory, layout, pid, int(code))
            if info is None:
                frames.append(UNKNOWN)
                continue
            where = locate(layout, int(code), info, int(instr))
            # Line 0 where the table has none: no line (None) is a native frame's.
            frames.append(PathFrame(where.function, where.filename, where.line or 0))
        if flags & TRUNCATED:
            frames.append(CUT)
        return tuple(reversed(frames))  # root first

    def _code(self, memory: Memory, layout: PyLayout, pid: int, code: int) -> CodeInfo | None:
        """The code object at `code`: from the cache if its fingerprint still matches."""
        known = self._codes.get((pid, code))
        try:
            fingerprint = _fingerprint(memory, layout, code)
            if known is not None and known.fingerprint == fingerprint:
                return known.info
            info = code_info(memory, layout, code)
        except MemoryReadError as exc:
            log.debug("code object %#x of %d: %s", code, pid, exc)
            # Gone (a stack first walked just before the process exited): the code object
            # read there while it lived, if any (no address can be reused after the exit).
            return known.info if known is not None else None
        self._codes[pid, code] = _Code(fingerprint, info)
        return info


def _line(line: int | None) -> int | None:
    """A line as the wire takes it: one out of range (memory read while it changed) is none."""
    return line if line is not None and 0 <= line < 2**31 else None


def _named(values: npt.NDArray[np.float64]) -> dict[str, float]:
    """A path's values by their names (wire.PATH_VALUES)."""
    return {"launches": float(values[FIELD["launches"]]),
            "gpu_ns": float(values[FIELD["gpu_ns"]]),
            "bytes": float(values[_COPIES].sum()),
            "blocked_ns": float(values[FIELD["blocked_ns"]]),
            "calls": float(values[_CALLS])}


def _fingerprint(memory: Memory, layout: PyLayout, code: int) -> bytes:
    """What tells one code object from another at the same address: the pointers to its
    name and file, and its first line (one read of the span that holds them)."""
    fields = [layout.code_filename, layout.code_name, layout.code_firstlineno]
    if layout.code_qualname >= 0:
        fields.append(layout.code_qualname)
    start, end = min(fields), max(fields) + 8
    raw = memory.read(code + start, end - start)
    return b"".join(raw[f - start:f - start + (4 if f == layout.code_firstlineno else 8)]
                    for f in fields)
