"""Loading an image (producer/probe/bpfload.py) into the kernel: maps created or opened where
pinned, their contents read and written, programs verified (a refusal says why), tracepoint
functions attached. Small hand-made images; tests/system/test_capture.py and
tests/system/test_kafka.py run the real programs from the cache."""

from __future__ import annotations

import errno
import os
import struct
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.probe import bpfimage, bpfload
from gpuflight.producer.probe.bpfimage import Image, MapSpec, ProgramSpec

pytestmark = pytest.mark.bpf

HASH, PERCPU_ARRAY, RINGBUF = 1, 6, 27
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


# r1 = map fd (patched in); r0 = 0; exit. The map load makes the program hold the map.
USES_MAP = (insn(0x18, 1, 1, 0, 99) + insn(0) + insn(0xB7, 0, 0, 0, 0) + insn(0x95))
RETURNS_ZERO = insn(0xB7, 0, 0, 0, 0) + insn(0x95)
READS_R2 = insn(0xBF, 0, 2) + insn(0x95)  # r0 = r2 (never written): the verifier refuses


def image(*programs: ProgramSpec, maps: tuple[MapSpec, ...] | None = None) -> Image:
    maps = maps if maps is not None else (
        MapSpec("pids", HASH, 4, 8, 64, 0),
        MapSpec("drops", PERCPU_ARRAY, 4, 8, 4, 0),
        MapSpec("ring", RINGBUF, 0, 0, 1 << 16, 0),
    )
    return Image("GPL", 0, maps, programs or (
        ProgramSpec("uses_map", USES_MAP, bpfimage.relocations(USES_MAP, {99: 0})),))


@pytest.fixture
def bpffs_dir() -> Iterator[Path]:
    base = Path("/sys/fs/bpf")
    if not os.path.ismount(base):
        pytest.skip("no bpffs at /sys/fs/bpf")
    folder = base / f"gftest-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()


def test_maps_hold_what_is_written() -> None:
    loaded = bpfload.LoadedObject(image())
    try:
        pids = loaded.map("pids")
        for pid in (3, 1, 2):
            pids.update(U32.pack(pid), U64.pack(pid * 10))
        assert sorted(U32.unpack(k)[0] for k in pids) == [1, 2, 3]
        assert dict(pids.items())[U32.pack(2)] == U64.pack(20)
        assert pids.lookup(U32.pack(9)) is None
        assert pids.delete(U32.pack(1)) and not pids.delete(U32.pack(1))
        pids.clear()
        assert pids.keys() == []
        with pytest.raises(ValueError, match="key of 2 bytes"):
            pids.lookup(b"\0\0")
        drops = loaded.map("drops")
        values = drops.lookup_percpu(U32.pack(0))
        assert len(values) == bpfload.possible_cpus() and set(values) == {U64.pack(0)}
        assert bpfload.map_spec(pids.fd, "pids") == MapSpec("pids", HASH, 4, 8, 64, 0)
        assert loaded.map("ring").spec.max_entries == 1 << 16
    finally:
        assert loaded.close() == 0


def test_a_program_gets_its_map_fd_and_loads() -> None:
    loaded = bpfload.LoadedObject(image())
    try:
        fd = loaded.program("uses_map")
        assert fd == loaded.program("uses_map")  # loaded once
        info = Path(f"/proc/self/fdinfo/{fd}").read_text()
        assert "prog_type:\t2" in info
    finally:
        loaded.close()


def test_a_program_the_verifier_refuses_says_why() -> None:
    loaded = bpfload.LoadedObject(image(ProgramSpec("bad", READS_R2, ())))
    try:
        with pytest.raises(OSError) as raised:
            loaded.program("bad")
        assert raised.value.errno == errno.EACCES
        assert "R2 !read_ok" in str(raised.value)  # the verifier's own words
    finally:
        loaded.close()


def test_preloading_keeps_every_program_loaded() -> None:
    programs = tuple(ProgramSpec(f"p{i}", RETURNS_ZERO, ()) for i in range(6))
    loaded = bpfload.LoadedObject(image(*programs))
    try:
        loaded.preload([p.name for p in programs])
        fds = {loaded.program(p.name) for p in programs}
        assert len(fds) == 6 and all(Path(f"/proc/self/fd/{fd}").exists() for fd in fds)
    finally:
        loaded.close()
    assert not any(Path(f"/proc/self/fd/{fd}").exists() and
                   "prog_type" in Path(f"/proc/self/fdinfo/{fd}").read_text() for fd in fds)


class GatedObject(bpfload.LoadedObject):
    """Loads on a loader thread wait for `gate` (this thread's do not); counts every load."""

    def __init__(self, image: Image, later: frozenset[str] = frozenset()) -> None:
        self.gate = threading.Event()
        self.loads: Counter[str] = Counter()
        self.threads: set[str] = set()
        super().__init__(image, later=later)

    def _load(self, name: str, prog_type: int, attach_type: int) -> int:
        if threading.current_thread() is not threading.main_thread():
            assert self.gate.wait(60), "the gate was never opened"
        self.loads[name] += 1
        self.threads.add(threading.current_thread().name)
        return super()._load(name, prog_type, attach_type)


def test_a_program_loading_in_the_background_is_waited_for_not_loaded_twice() -> None:
    programs = tuple(ProgramSpec(f"p{i}", RETURNS_ZERO, ()) for i in range(5))
    loaded = GatedObject(image(*programs))
    try:
        loaded.load_in_background([p.name for p in programs])
        assert loaded.background_failure() == (False, None)  # nothing loaded yet: the gate
        got: list[int] = []
        asker = threading.Thread(target=lambda: got.append(loaded.program("p3")))
        asker.start()  # asks while p3 is held at the gate: must wait for the loader thread's
        loaded.gate.set()
        asker.join(60)
        loaded.wait_loaded()
        assert loaded.background_failure() == (True, None)
        assert loaded.loads == {p.name: 1 for p in programs}  # each loaded once, p3 too
        assert all(name.startswith("gf-bpfload") for name in loaded.threads)
        assert got == [loaded.program("p3")]
        info = Path(f"/proc/self/fdinfo/{got[0]}").read_text()
        assert "prog_type:\t2" in info
        fds = {loaded.program(p.name) for p in programs}
        assert len(fds) == 5 and set(loaded.fds()) >= fds
    finally:
        assert loaded.close() == 0
    assert not any(Path(f"/proc/self/fd/{fd}").exists() and
                   "prog_type" in Path(f"/proc/self/fdinfo/{fd}").read_text() for fd in fds)


class LastWaitsToBeAsked(bpfload.LoadedObject):
    """The loader thread's load of "also_good" waits until somebody asks for it: a
    `wait_loaded` that stopped at the first failure would return with it still loading."""

    def __init__(self, image: Image) -> None:
        self.asked = threading.Event()
        super().__init__(image)

    def _load(self, name: str, prog_type: int, attach_type: int) -> int:
        if name == "also_good" and threading.current_thread() is not threading.main_thread():
            assert self.asked.wait(60), "also_good was never asked for"
        return super()._load(name, prog_type, attach_type)

    def program(self, name: str, prog_type: int = bpfload.BPF_PROG_TYPE_KPROBE,
                attach_type: int = -1) -> int:
        if name == "also_good":
            self.asked.set()
        return super().program(name, prog_type, attach_type)


def test_a_program_refused_in_the_background_is_its_error_when_asked_for() -> None:
    programs = (ProgramSpec("good", RETURNS_ZERO, ()), ProgramSpec("bad", READS_R2, ()),
                ProgramSpec("also_good", RETURNS_ZERO, ()))
    loaded = LastWaitsToBeAsked(image(*programs))
    try:
        loaded.load_in_background([p.name for p in programs])
        with pytest.raises(OSError) as raised:
            loaded.program("bad")  # waits for the loader thread, then its error
        assert raised.value.errno == errno.EACCES
        assert "R2 !read_ok" in str(raised.value)
        with pytest.raises(OSError, match="R2 !read_ok"):
            loaded.wait_loaded()  # the first failure, once all the rest are loaded too
        assert loaded.background_failure() == (True, raised.value)
        assert loaded.program("good") != loaded.program("also_good")  # the others loaded
        with pytest.raises(OSError, match="R2 !read_ok"):
            loaded.program("bad")  # asked again: the same error, not a second load
    finally:
        assert loaded.close() == 0


def test_closing_while_programs_load_drops_the_rest_and_frees_them_all() -> None:
    """close() drops the loads not begun, waits for those under way (never long: the
    kernel's verification), and closes their fds: none is left behind."""
    programs = tuple(ProgramSpec(f"p{i}", RETURNS_ZERO, ()) for i in range(40))
    before = set(os.listdir("/proc/self/fd"))
    loaded = GatedObject(image(*programs))
    loaded.load_in_background([p.name for p in programs])
    futures = list(loaded._pending.values())
    closer = threading.Thread(target=loaded.close)
    closer.start()
    while not all(f.cancelled() or f.running() for f in futures):  # close() drops the rest
        assert closer.is_alive()
    loaded.gate.set()  # the loads under way go on, and close() waits for them
    closer.join(60)
    assert not closer.is_alive()
    begun = sum(1 for f in futures if not f.cancelled())
    assert 1 <= begun <= (os.cpu_count() or 1) < 40
    assert sum(loaded.loads.values()) == begun
    assert set(os.listdir("/proc/self/fd")) <= before


def test_maps_left_for_later_are_made_before_the_programs_that_use_them() -> None:
    """`later` maps are not made at once; the loader threads make them before any function
    that uses them, and `map` waits for them; one a tracepoint function uses is made at once."""
    tracepoint = "tracepoint__sched__sched_process_fork"
    programs = (ProgramSpec("uses_map", USES_MAP, bpfimage.relocations(USES_MAP, {99: 0})),
                ProgramSpec(tracepoint, USES_MAP, bpfimage.relocations(USES_MAP, {99: 1})))
    maps = (MapSpec("pids", HASH, 4, 8, 64, 0), MapSpec("drops", HASH, 4, 8, 4, 0))
    loaded = GatedObject(image(*programs, maps=maps), later=frozenset({"pids", "drops"}))
    try:
        assert "pids" not in loaded.maps and "drops" in loaded.maps  # drops: the tracepoint's
        loaded.load_in_background(["uses_map"])
        loaded.gate.set()
        fd = loaded.program("uses_map")
        pids = loaded.map("pids")
        info = Path(f"/proc/self/fdinfo/{fd}").read_text()
        assert "prog_type:\t2" in info
        map_info = Path(f"/proc/self/fdinfo/{pids.fd}").read_text()
        assert "map_type:\t1" in map_info and "max_entries:\t64" in map_info
        pids.update(U32.pack(1), U64.pack(2))
        assert loaded.map("pids").lookup(U32.pack(1)) == U64.pack(2)
    finally:
        assert loaded.close() == 0


def test_a_map_left_for_later_is_made_when_first_asked_for() -> None:
    loaded = bpfload.LoadedObject(image(), later=frozenset({"pids"}))
    try:
        assert "pids" not in loaded.maps
        loaded.map("pids").update(U32.pack(3), U64.pack(30))  # made now, on this thread
        assert loaded.maps["pids"].lookup(U32.pack(3)) == U64.pack(30)
        assert loaded.program("uses_map") > 0
    finally:
        assert loaded.close() == 0


def test_a_map_the_kernel_refuses_later_is_the_error_of_what_needs_it() -> None:
    refused = MapSpec("pids", HASH, 4, 8, 0, 0)  # no entries: EINVAL
    maps = (refused, MapSpec("ring", RINGBUF, 0, 0, 1 << 16, 0))
    loaded = bpfload.LoadedObject(image(maps=maps), later=frozenset({"pids"}))
    try:
        loaded.load_in_background(["uses_map"])
        with pytest.raises(SetupError, match="the BPF map pids cannot be created: Invalid"):
            loaded.program("uses_map")
        _done, failure = loaded.background_failure()
        assert isinstance(failure, SetupError) and "pids cannot be created" in str(failure)
        with pytest.raises(SetupError, match="pids cannot be created"):
            loaded.wait_loaded()
    finally:
        assert loaded.close() == 0


def test_pinned_maps_are_made_once_and_found_again(bpffs_dir: Path) -> None:
    """The tally's maps outlive the agent (producer/publish/deadagents.py): the first load creates
    and
    pins them, the next opens the same map, and one of another shape is refused."""
    pin = {"pids": bpffs_dir / "pids"}
    first = bpfload.LoadedObject(image(), pin)
    try:
        first.map("pids").update(U32.pack(7), U64.pack(70))
    finally:
        first.close()
    assert (bpffs_dir / "pids").exists()
    second = bpfload.LoadedObject(image(), pin)
    try:
        assert second.map("pids").lookup(U32.pack(7)) == U64.pack(70)
    finally:
        second.close()
    other = (MapSpec("pids", HASH, 4, 16, 64, 0),)
    with pytest.raises(SetupError, match="is not the program's pids"):
        bpfload.LoadedObject(image(ProgramSpec("p", RETURNS_ZERO, ()), maps=other), pin)


# *(u32 *)(fp - 4) = 0; r2 = fp - 4; r1 = map; r0 = lookup(r1, r2); if r0: *(u64 *)r0 += 1
COUNTS = (insn(0x62, 10, 0, -4, 0) + insn(0xBF, 2, 10) + insn(0x07, 2, 0, 0, -4)
          + insn(0x18, 1, 1, 0, 99) + insn(0) + insn(0x85, 0, 0, 0, 1)
          + insn(0x15, 0, 0, 2, 0) + insn(0xB7, 1, 0, 0, 1) + insn(0xDB, 0, 1, 0, 0)
          + insn(0xB7, 0, 0, 0, 0) + insn(0x95))
ARRAY = 2


def test_raw_tracepoint_functions_are_attached_and_run() -> None:
    """`raw_tracepoint__<name>` functions go to their raw tracepoints (no perf event, whose
    release would wait under the kernel's event_mutex), and run there: this one counts the
    forks of the machine."""
    name = "raw_tracepoint__sched_process_fork"
    counts = (MapSpec("forks", ARRAY, 4, 8, 1, 0),)
    loaded = bpfload.LoadedObject(image(
        ProgramSpec(name, COUNTS, bpfimage.relocations(COUNTS, {99: 0})), maps=counts))
    try:
        assert list(loaded.tracepoints) == ["raw:sched_process_fork"]
        link = loaded.tracepoints["raw:sched_process_fork"]
        assert "link_type:\traw_tracepoint" in Path(f"/proc/self/fdinfo/{link}").read_text()
        prog = loaded.program(name, bpfload.BPF_PROG_TYPE_RAW_TRACEPOINT)
        assert "prog_type:\t17" in Path(f"/proc/self/fdinfo/{prog}").read_text()
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        forks = U64.unpack(loaded.map("forks").lookup(U32.pack(0)) or bytes(8))[0]
        assert forks >= 1
    finally:
        assert loaded.close() == 0


def test_a_missing_raw_tracepoint_is_one_error() -> None:
    name = "raw_tracepoint__gpuflight_no_such_event"
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(SetupError, match="raw tracepoint gpuflight_no_such_event is not there"):
        bpfload.LoadedObject(image(ProgramSpec(name, RETURNS_ZERO, ())))
    assert set(os.listdir("/proc/self/fd")) <= before  # what it made is closed again


def test_tracepoint_functions_are_attached_and_a_missing_one_is_one_error(
        tmp_path: Path) -> None:
    name = "tracepoint__sched__sched_process_fork"
    loaded = bpfload.LoadedObject(image(ProgramSpec(name, RETURNS_ZERO, ())))
    try:
        assert list(loaded.tracepoints) == ["sched:sched_process_fork"]
    finally:
        loaded.close()
    with pytest.raises(SetupError, match="tracepoint sched:sched_process_fork is not there"):
        bpfload.LoadedObject(image(ProgramSpec(name, RETURNS_ZERO, ())), tracefs=tmp_path)


@pytest.mark.parametrize("eagains", [2, bpfload.PROG_LOAD_ATTEMPTS])
def test_a_load_the_verifier_gave_up_on_for_a_signal_is_tried_again(
        eagains: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifier answers EAGAIN when a signal is pending for the loading thread (a child's
    SIGCHLD): the load is tried again, up to PROG_LOAD_ATTEMPTS times in all, as libbpf does;
    then EAGAIN is its error."""
    real = bpfload.bpf
    refused: list[int] = []

    def interrupted(command: int, attr: object) -> int:
        if command == bpfload.BPF_PROG_LOAD and len(refused) < eagains:
            refused.append(command)
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real(command, attr)  # type: ignore[arg-type]

    monkeypatch.setattr(bpfload, "bpf", interrupted)
    loaded = bpfload.LoadedObject(image())
    try:
        if eagains < bpfload.PROG_LOAD_ATTEMPTS:
            assert loaded.program("uses_map") > 0
        else:
            with pytest.raises(OSError) as raised:
                loaded.program("uses_map")
            assert raised.value.errno == errno.EAGAIN
        assert len(refused) == eagains
    finally:
        assert loaded.close() == 0
