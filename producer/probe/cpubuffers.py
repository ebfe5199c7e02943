"""The per-CPU event buffers (bpf/cudart.bpf.c, GF_CPU_SLOTS), read where the kernel keeps them,
and merged with the events ring into one stream in each thread's order.

A probe writes its event into a slot of its CPU's buffer (two BPF_F_MMAPABLE arrays: the
slots, and each CPU's `head` and `tail`), not into the ring, when the buffer has room: it
saves the ring's reservation and its cold lines (bench/results/overhead.md). A slot is taken
by compare-and-swap on `head`, filled, and stamped last with its position + 1 (`committed`); this
reader copies the stamped slots out and moves `tail` past every slot up to the first one not
stamped yet (a program preempted between taking and stamping it: slots after it are taken,
remembered, and passed over when the tail comes to them). It writes nothing in the slots: their
lines go back to the programs' CPU with no change of ours to fetch.

Order. The ring hands events on in the order they were committed: each thread's in the order
it made them, and a call that returned before another began (a free before another thread's
allocation of the same pointer) before it. Two sources read one after the other do not (a
thread that launches on CPU A just after A was read, then syncs into the ring, would have its
sync handed on first). `MergedEvents` restores that order by when each call was done with
(`finished_ns`: its entry where it is recorded there, its return where it is completed there,
which is when it is committed), with one rule: a pass notes the clock (`t0`) as it takes the
buffers, before it reads the ring (what the mover took earlier was taken before that), and
hands on only events done before `t0`, and before any event it saw in the ring but could not
take yet (behind a record still being written, or past the batch); the rest wait for the next
pass. Why that suffices: a thread's call starts after its previous one was committed, so when
an event done before `t0` is handed on, its thread's previous event was committed before `t0`,
before either source was read, and was read by this pass or an earlier one — in a CPU's
buffer every committed slot is taken, and in the ring it is taken unless something in front of
it was not, which the second bound catches. Within what a pass hands on, a stable sort by that
time puts each thread's events back in order (each source keeps them in order, and their
times increase).
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from typing import Final

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract import records
from gpuflight.producer.contract.abi import (
    CPU_HEAD_DTYPE,
    EVENT_DTYPE,
    SLOT_DISCARDED,
    SLOT_DTYPE,
)
from gpuflight.producer.probe.ringbuf import RingBufferReader

log = logging.getLogger(__name__)

#: How often the mover takes the buffers' events out while they come fast (a CPU's buffer
#: found more than an eighth full), and otherwise.
MOVE_INTERVAL_S: Final = 0.001
IDLE_INTERVAL_S: Final = 0.02

_DISCARDED: Final = np.uint64(SLOT_DISCARDED)


def mapped_bytes(nbytes: int) -> int:
    """What an mmap of an array map of `nbytes` of values spans (whole pages)."""
    return (nbytes + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


class CpuBuffers:
    """The kernel's per-CPU event buffers: `ncpus` buffers of `slots` slots each, in
    `slots_map` (struct gf_slot) and `heads_map` (struct gf_cpu_head), shared with the kernel."""

    def __init__(self, slots_map: mmap.mmap, heads_map: mmap.mmap, ncpus: int,
                 slots: int) -> None:
        if slots <= 0 or slots & (slots - 1):
            raise ValueError(f"slots per CPU must be a power of two, got {slots}")
        self._ncpus = ncpus
        self._slots_n = slots
        self._slots_map = slots_map
        self._heads_map = heads_map
        self._slots = np.frombuffer(slots_map, dtype=SLOT_DTYPE,
                                    count=ncpus * slots).reshape(ncpus, slots)
        self._heads = np.frombuffer(heads_map, dtype=CPU_HEAD_DTYPE, count=ncpus)
        #: Per CPU, the slots past its tail already taken (behind one not committed yet).
        self._taken: list[set[int]] = [set() for _ in range(ncpus)]
        #: The most slots one CPU held at the latest `take`.
        self.last_fullest = 0

    @classmethod
    def open(cls, slots_fd: int, heads_fd: int, ncpus: int, slots: int) -> CpuBuffers:
        """The buffers of the two BPF_F_MMAPABLE array maps `slots_fd` and `heads_fd`."""
        maps = [mmap.mmap(fd, mapped_bytes(nbytes), mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
                for fd, nbytes in ((slots_fd, ncpus * slots * SLOT_DTYPE.itemsize),
                                   (heads_fd, ncpus * CPU_HEAD_DTYPE.itemsize))]
        return cls(maps[0], maps[1], ncpus, slots)

    @property
    def slots(self) -> int:
        """Slots in each CPU's buffer."""
        return self._slots_n

    def take(self) -> npt.NDArray[np.void]:
        """Every committed event of every CPU's buffer (EVENT_DTYPE; each CPU's in the order
        their slots were taken), and their slots freed."""
        out: list[npt.NDArray[np.void]] = []
        mask = self._slots_n - 1
        heads = self._heads["head"].copy()
        tails = self._heads["tail"].copy()
        self.last_fullest = int((heads - tails).max()) if self._ncpus else 0
        for cpu in np.flatnonzero(heads != tails).tolist():
            tail = int(tails[cpu])
            head = min(int(heads[cpu]), tail + self._slots_n)  # never more than a lap
            positions = np.arange(tail, head, dtype=np.uint64)
            index = (positions & np.uint64(mask)).astype(np.intp)
            row = self._slots[cpu]
            state = row["committed"][index]
            stamp = positions + np.uint64(1)
            full = state == stamp
            freed = full | (state == (stamp | _DISCARDED))
            taken = self._taken[cpu]
            if taken:
                before = np.isin(positions, np.fromiter(taken, dtype=np.uint64))
                full &= ~before
                freed |= before
            if full.any():
                out.append(records.take(row["ev"], index[full]))  # a copy
            first_open = int(np.argmin(freed)) if not freed.all() else len(positions)
            if first_open:
                self._heads["tail"][cpu] = tail + first_open
            beyond = positions[first_open:][freed[first_open:]]
            self._taken[cpu] = {int(p) for p in beyond}
        if not out:
            return np.empty(0, dtype=EVENT_DTYPE)
        return out[0] if len(out) == 1 else records.join(out)

    def close(self) -> None:
        del self._slots, self._heads
        self._slots_map.close()
        self._heads_map.close()


def finished_ns(events: npt.NDArray[np.void]) -> npt.NDArray[np.uint64]:
    """When each event's call was done with (what the merge orders by): at its entry where it
    is recorded there, else at its return (`ts_ns` + `duration_ns`, 0 for the former). The
    ring's own order is that one; by entry, a free returned before another thread's
    allocation of the same pointer began would come after it."""
    return events["ts_ns"] + events["duration_ns"]  # type: ignore[no-any-return]


class MergedEvents:
    """The events ring and the per-CPU buffers as one stream, in each thread's order (the
    module's docstring): what a pass may not hand on yet waits in `_waiting`.

    A CPU's buffer holds a few milliseconds of a tight launch loop, less than a turn of the
    capture loop: `move` (a thread of its own calls it, `MOVE_INTERVAL_S`) takes the buffers'
    events out as they come, and `drain` merges what it moved."""

    def __init__(self, ring: RingBufferReader, buffers: CpuBuffers) -> None:
        self._ring = ring
        self._buffers = buffers
        self._waiting = np.empty(0, dtype=EVENT_DTYPE)
        #: Takes of the buffers one at a time, and what the mover took.
        self._lock = threading.Lock()
        self._moved: list[npt.NDArray[np.void]] = []
        self._stop = threading.Event()
        self._mover: threading.Thread | None = None
        self.from_cpus = self.from_ring = 0

    def start_moving(self) -> None:
        """Move the buffers' events out on a thread of this one's: every MOVE_INTERVAL_S
        while a CPU's buffer was found more than an eighth full, else every IDLE_INTERVAL_S."""
        self._mover = threading.Thread(target=self._keep_moving, name="gf-cpu-events",
                                       daemon=True)
        self._mover.start()

    def _keep_moving(self) -> None:
        busy = self._buffers.slots // 8
        interval = IDLE_INTERVAL_S
        while not self._stop.wait(interval):
            try:
                fullest = self.move()
            except Exception as exc:  # the capture's own drain still takes them
                log.warning("moving events out of the per-CPU buffers failed: %s", exc)
                return
            interval = MOVE_INTERVAL_S if fullest > busy else IDLE_INTERVAL_S

    def close(self) -> None:
        """Stop the mover (what it moved stays for the last drain)."""
        self._stop.set()
        if self._mover is not None:
            self._mover.join(timeout=5)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def move(self) -> int:
        """Take what the per-CPU buffers hold now; the most one CPU's held, in slots."""
        with self._lock:
            self._move_locked()
            return self._buffers.last_fullest

    def _move_locked(self) -> None:
        taken = self._buffers.take()
        if len(taken):
            self._moved.append(taken)

    def _take_moved(self) -> tuple[npt.NDArray[np.void], int]:
        """What the buffers held when this was called, and what `move` took before; and when
        the take began."""
        with self._lock:
            began = time.monotonic_ns()
            self._move_locked()
            moved, self._moved = self._moved, []
        if not moved:
            return np.empty(0, dtype=EVENT_DTYPE), began
        return (moved[0] if len(moved) == 1 else records.join(moved)), began

    def drain(self, max_events: int | None = None,
              everything: bool = False) -> npt.NDArray[np.void]:
        """The events both sources hold that may be handed on now, oldest first by thread.
        `everything` (at the end, the probes quiet): all of them, the waiting ones too, but
        for those behind what the ring still holds while it gives more."""
        from_cpus, cut = self._take_moved()
        from_ring = self._ring.drain(max_events)
        if everything:
            cut = np.iinfo(np.int64).max
        behind = self._ring.untaken_min_ts
        if behind is not None and (len(from_ring) or not everything):
            cut = min(cut, behind)
        self.from_cpus += len(from_cpus)
        self.from_ring += len(from_ring)
        parts = [p for p in (self._waiting, from_ring, from_cpus) if len(p)]
        if not parts:
            return np.empty(0, dtype=EVENT_DTYPE)
        events = parts[0] if len(parts) == 1 else records.join(parts)
        done = finished_ns(events)
        if len(parts) > 1 or not len(from_ring):  # the ring alone is in each thread's order
            order = np.argsort(done, kind="stable")
            events, done = records.take(events, order), done[order]
        ready, self._waiting = records.split(events, done >= np.uint64(cut))
        return ready
