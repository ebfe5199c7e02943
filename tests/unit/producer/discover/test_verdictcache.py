"""The on-disk verdict cache (producer/verdictcache.py): a file classified by one run is not read
again by the next, and a cache file that is stale, damaged or not ours changes nothing.

The inputs are real files: NVIDIA's libcudart (the nvidia-cuda-runtime wheel, a dev
dependency; never run, only read), this system's libc and dynamic loader, copied into a
fake /proc tree that maps them by their real device and inode.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from gpuflight.producer.discover import attachplan, elfsyms, procmaps, verdictcache
from gpuflight.producer.discover.procmaps import Classifier, LibraryFile, LibraryKey
from gpuflight.producer.settings import CaptureSettings, default_cache_dir
from tests.conftest import require

PID = 4242


def _nvidia_runtime() -> Path | None:
    for entry in sys.path:
        found = sorted((Path(entry) / "nvidia").glob("*/lib/libcudart.so.1[0-9]"))
        if found:
            return found[0]
    return None


def _system_file(name: str) -> Path | None:
    for folder in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64"):
        path = Path(folder) / name
        if path.is_file():
            return path.resolve()
    return None


@dataclass
class Node:
    """One process mapping a real CUDA runtime, libc and the loader, through a fake /proc."""

    proc: Path
    files: dict[str, Path]  # name → the file (hard-linked into the process's root)

    def key(self, name: str) -> LibraryKey:
        st = self.files[name].stat()
        return (st.st_dev, st.st_ino)

    def scan(self, classifier: Classifier) -> dict[LibraryKey, LibraryFile]:
        return dict(procmaps.scan(self.proc, cache=classifier).libraries)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    sources = {
        "libcudart.so": _nvidia_runtime(),
        "libc.so.6": _system_file("libc.so.6"),
        "ld-linux-x86-64.so.2": _system_file("ld-linux-x86-64.so.2"),
    }
    missing = [name for name, path in sources.items() if path is None]
    require(f"no {', '.join(missing)} to classify (pip install -e .[dev])" if missing else None)
    store, pid_dir = tmp_path / "store", tmp_path / "proc" / str(PID)
    store.mkdir()
    pid_dir.mkdir(parents=True)
    (pid_dir / "stat").write_text(f"{PID} (python3) S 1 {PID} {PID} 0 -1 4194304 0\n")
    files: dict[str, Path] = {}
    lines = []
    for i, (name, source) in enumerate(sources.items()):
        assert source is not None
        files[name] = store / name
        shutil.copyfile(source, files[name])
        inside = pid_dir / "root" / "lib" / name
        inside.parent.mkdir(parents=True, exist_ok=True)
        os.link(files[name], inside)  # before any stat: a link changes the ctime
        st = files[name].stat()
        start = 0x7F0000000000 + i * 0x100000
        lines.append(
            f"{start:x}-{start + 0x2000:x} r-xp 00001000 "
            f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino}    /lib/{name}"
        )
    (pid_dir / "maps").write_text("\n".join(lines) + "\n")
    return Node(tmp_path / "proc", files)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files classification reads (defined_functions and referenced_functions calls), by
    the paths they were opened from (a file is read through its descriptor, /proc/self/fd/N)."""
    seen: list[str] = []
    defined, referenced = elfsyms.defined_functions, elfsyms.referenced_functions

    def counted_defined(path: str, wanted: frozenset[str], *rest: frozenset[str]) -> frozenset[str]:
        seen.append(os.readlink(path) if path.startswith("/proc/self/fd/") else path)
        return defined(path, wanted, *rest)

    def counted_referenced(path: str, wanted: frozenset[str]) -> frozenset[str] | None:
        seen.append(os.readlink(path) if path.startswith("/proc/self/fd/") else path)
        return referenced(path, wanted)

    monkeypatch.setattr(elfsyms, "defined_functions", counted_defined)
    monkeypatch.setattr(elfsyms, "referenced_functions", counted_referenced)
    return seen


def forbid_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ELF read at all: not to classify, nor for where to attach (attachplan)."""

    def fail(path: str, wanted: object, *rest: object) -> frozenset[str]:
        raise AssertionError(f"{path} was read again")

    for name in ("defined_functions", "referenced_functions", "function_addresses",
                 "symbol_address", "vaddr_to_file_offset"):
        monkeypatch.setattr(elfsyms, name, fail)


def _identity_tail(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def learn(node: Node, cache: Path) -> dict[LibraryKey, LibraryFile]:
    """One run: classify the node's files with the store in `cache`, and save it."""
    store = procmaps.open_verdict_store(cache)
    found = node.scan(Classifier(store=store))
    assert store.save_if_dirty()
    elfsyms.clear_cache()
    return found


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def vocabulary() -> verdictcache.Vocabulary:
    return verdictcache.Vocabulary(
        procmaps.RUNTIME_SYMBOLS, procmaps.DRIVER_SYMBOLS, procmaps._REFERENCED_SYMBOLS,
        attachplan.PROBED, procmaps._HOOK_SYMBOLS,
    )


def identity(n: int) -> verdictcache.Identity:
    return (2049, 1000 + n, 4096, 1_700_000_000_000_000_000 + n, 1_700_000_000_000_000_000)


NOTHING = verdictcache.Stored(frozenset(), frozenset(), None)


# --- reuse ------------------------------------------------------------------------------------


def test_a_verdict_is_reused_by_the_next_run_without_reading_the_file(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = learn(node, cache)
    assert {lib.kind for lib in first.values()} == {"runtime", "loader"}
    runtime = first[node.key("libcudart.so")]
    assert "cudaLaunchKernel" in runtime.symbols

    forbid_reading(monkeypatch)  # nor for where to attach: the plans come back too
    store = procmaps.open_verdict_store(cache)
    assert len(store) == 3  # libc too (where a process exits: code paths' hook)
    assert node.scan(Classifier(store=store)) == first
    assert store.hits == 3 and store.learned == 0
    assert not store.dirty and not store.save_if_dirty()  # nothing new: no write


def test_the_quiet_files_are_those_nothing_probed_is_in(node: Node, tmp_path: Path) -> None:
    """The files a dlopen may map unheld (Probes.add_quiet): libc (nothing probed), not the
    runtime nor the loader; by stat's identity with the change time, from the store at start
    and from the Classifier once per file as it meets them."""
    libc = node.files["libc.so.6"].stat()
    want = [(libc.st_dev, libc.st_ino, libc.st_size, libc.st_ctime_ns)]
    classifier = Classifier(store=procmaps.open_verdict_store(tmp_path / "cache"))
    node.scan(classifier)
    assert classifier.take_quiet() == want
    node.scan(classifier)
    assert classifier.take_quiet() == []  # told once
    assert classifier.store is not None and classifier.store.save_if_dirty()
    assert procmaps.open_verdict_store(tmp_path / "cache").quiet_files() == want
    recalled = Classifier(store=procmaps.open_verdict_store(tmp_path / "cache"))
    node.scan(recalled)
    assert recalled.take_quiet() == want  # recalled from the store: as quiet


def test_a_file_s_attach_plan_is_kept_with_its_verdict(node: Node, tmp_path: Path) -> None:
    """Where each probe goes (attachplan) is what the file's symbols say, read at the first
    run; the next run gets the same plan from the store."""
    first = learn(node, tmp_path / "cache")
    runtime = first[node.key("libcudart.so")]
    path = str(node.files["libcudart.so"])
    assert runtime.plan is not None and runtime.plan.kind == "runtime"
    offsets = dict(runtime.plan.offsets)
    addresses = elfsyms.function_addresses(path, attachplan.PROBED["runtime"])
    assert offsets.keys() == addresses.keys() and "cudaLaunchKernel" in offsets
    for name, address in addresses.items():
        assert offsets[name] == elfsyms.vaddr_to_file_offset(path, address)
    loader = first[node.key("ld-linux-x86-64.so.2")]
    ld = str(node.files["ld-linux-x86-64.so.2"])
    assert loader.plan is not None and loader.plan.kind == "loader"
    debug_state = elfsyms.symbol_address(ld, attachplan.LOADER_SYMBOL)
    r_debug = elfsyms.symbol_address(ld, attachplan.R_DEBUG_SYMBOL)
    assert debug_state is not None and r_debug is not None
    assert loader.plan.offsets == (
        (attachplan.LOADER_SYMBOL, elfsyms.vaddr_to_file_offset(ld, debug_state)),
    )
    assert loader.plan.cookie == (r_debug + attachplan.R_STATE_OFFSET - debug_state) % 2**64
    store = procmaps.open_verdict_store(tmp_path / "cache")
    st = node.files["libcudart.so"].stat()
    kept = store.get((*node.key("libcudart.so"), st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    assert kept is not None and kept.plan == runtime.plan


def test_a_plan_read_from_a_file_gone_meanwhile_is_not_kept(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that cannot be opened once its plan is read (its process gone) reads as having
    nowhere to attach: true for now, so neither remembered nor stored; the next scan reads it."""
    store = procmaps.open_verdict_store(tmp_path / "cache")
    classifier = Classifier(store=store)
    monkeypatch.setattr(procmaps, "_readable", lambda path: False)
    node.scan(classifier)
    assert not store.dirty
    monkeypatch.undo()
    planned: list[str] = []
    read_plan = attachplan.read_plan

    def counted(path: str, kind: str, size: int,
                probe_only: frozenset[str] | None = None) -> attachplan.Plan:
        planned.append(Path(os.readlink(path)).name)  # read through /proc/self/fd/N
        return read_plan(path, kind, size, probe_only)

    monkeypatch.setattr(attachplan, "read_plan", counted)
    found = node.scan(classifier)
    assert sorted(planned) == ["ld-linux-x86-64.so.2", "libcudart.so"]
    plan = found[node.key("libcudart.so")].plan
    assert plan is not None and plan.offset("cudaLaunchKernel") is not None
    assert store.dirty


def test_a_plan_round_trips_to_its_limits(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    runtime = verdictcache.Stored(
        frozenset({"cudaMalloc", "cudaFree"}), frozenset(), None, frozenset({"cudaMalloc"}),
        attachplan.Plan("runtime", (("__cudaRegisterFunction", 0), ("cudaFree", None),
                                    ("cudaMalloc", 4095))),
    )
    loader = verdictcache.Stored(frozenset(), frozenset(), True, None,
                             attachplan.Plan("loader", (("_dl_debug_state", 64),), 2**64 - 8))
    none = verdictcache.Stored(frozenset(), frozenset(), False, None, attachplan.Plan("loader", ()))
    store = verdictcache.VerdictStore.load(cache, *_args())
    for n, verdict in enumerate((runtime, loader, none)):
        store.put(identity(n), verdict)  # each file 4096 bytes
    assert store.save_if_dirty()
    kept = verdictcache.VerdictStore.load(cache, *_args())
    assert [kept.get(identity(n)) for n in range(3)] == [runtime, loader, none]


def test_a_plan_with_probes_moved_past_their_entries_round_trips(tmp_path: Path) -> None:
    """Where each probe goes, which were moved past their function's entry (and from where),
    and which are single-stepped: all kept, so that a warm start attaches and counts alike."""
    cache = tmp_path / "cache"
    driver = verdictcache.Stored(
        frozenset(), frozenset({"cuLaunchKernel", "cuMemcpy"}), None, None,
        attachplan.Plan("driver", (("cuLaunchKernel", 1034), ("cuMemcpy", 2048),
                                   ("cuMemcpyAsync", None)),
                        entries=(("cuLaunchKernel", 1024),), stepped=frozenset({"cuMemcpy"})),
    )
    store = verdictcache.VerdictStore.load(cache, *_args())
    store.put(identity(1), driver)
    assert store.save_if_dirty()
    kept = verdictcache.VerdictStore.load(cache, *_args()).get(identity(1))
    assert kept == driver and kept.plan is not None
    assert kept.plan.entry("cuLaunchKernel") == 1024 and kept.plan.entry("cuMemcpy") == 2048


def test_files_that_define_nothing_are_kept_compactly(node: Node, tmp_path: Path) -> None:
    learn(node, tmp_path / "cache")
    store = procmaps.open_verdict_store(tmp_path / "cache")
    store.put((1, 2, 3, 4, 5), verdictcache.Stored(frozenset(), frozenset(), None))
    assert store.save_if_dirty()
    document = orjson.loads((tmp_path / "cache" / verdictcache.FILE_NAME).read_bytes())
    rows = {row[1]: row for row in document["entries"]}
    assert rows[2] == [1, 2, 3, 4, 5, rows[2][5]]  # identity and last use only
    runtime = rows[node.key("libcudart.so")[1]]
    assert "cudaLaunchKernel" in runtime[7]
    # libc defines where a process exits (a hook of code paths), and nothing else.
    assert rows[node.key("libc.so.6")[1]][6:] == [None, [], [], None, None, ["_exit"]]
    recalled = procmaps.open_verdict_store(tmp_path / "cache").get(
        (*node.key("libc.so.6"), *_identity_tail(node.files["libc.so.6"])))
    assert recalled is not None and recalled.hooks == {"_exit"} and recalled.is_quiet


def test_a_changed_file_is_read_again(node: Node, tmp_path: Path, reads: list[str]) -> None:
    cache = tmp_path / "cache"
    learn(node, cache)
    reads.clear()
    # libc becomes a runtime in place (same inode): its size and mtime change.
    libc = node.files["libc.so.6"]
    libc.write_bytes(node.files["libcudart.so"].read_bytes())
    found = node.scan(Classifier(store=procmaps.open_verdict_store(cache)))
    assert found[node.key("libc.so.6")].kind == "runtime"
    assert {Path(p).name for p in reads} == {"libc.so.6"}


def test_a_file_rewritten_with_its_old_size_and_mtime_is_read_again(
    node: Node, tmp_path: Path, reads: list[str]
) -> None:
    cache = tmp_path / "cache"
    learn(node, cache)
    reads.clear()
    libc = node.files["libc.so.6"]
    before = libc.stat()
    data = bytearray(libc.read_bytes())
    data[-1] ^= 0xFF
    libc.write_bytes(data)
    os.utime(libc, ns=(before.st_atime_ns, before.st_mtime_ns))  # anyone may set the mtime
    after = libc.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    node.scan(Classifier(store=procmaps.open_verdict_store(cache)))
    assert {Path(p).name for p in reads} == {"libc.so.6"}  # the ctime told


def test_what_a_run_learns_is_saved_for_the_next(node: Node, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    learn(node, cache)
    libc = node.files["libc.so.6"]
    libc.write_bytes(node.files["libcudart.so"].read_bytes())
    learn(node, cache)  # learns libc's new verdict and saves it
    store = procmaps.open_verdict_store(cache)
    key = node.key("libc.so.6")
    st = libc.stat()
    kept = store.get((*key, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    assert kept is not None and "cudaLaunchKernel" in kept.runtime


def test_two_runs_saving_at_once_keep_both_verdicts(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fingerprint = procmaps.verdict_fingerprint()
    one = verdictcache.VerdictStore.load(cache, fingerprint, vocabulary())
    two = verdictcache.VerdictStore.load(cache, fingerprint, vocabulary())
    one.put(identity(1), NOTHING)
    two.put(identity(2), NOTHING)
    assert one.save_if_dirty() and two.save_if_dirty()
    both = verdictcache.VerdictStore.load(cache, fingerprint, vocabulary())
    assert both.get(identity(1)) == NOTHING and both.get(identity(2)) == NOTHING


# --- stale, damaged, hostile ------------------------------------------------------------------


def test_a_changed_probe_table_ignores_the_old_verdicts(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: list[str]
) -> None:
    cache = tmp_path / "cache"
    learn(node, cache)
    reads.clear()
    # A gpuflight that probes one runtime function fewer.
    fewer = procmaps.RUNTIME_SYMBOLS - {"cudaMemcpy"}
    monkeypatch.setattr(procmaps, "RUNTIME_SYMBOLS", fewer)
    store = procmaps.open_verdict_store(cache)
    assert len(store) == 0
    node.scan(Classifier(store=store))
    assert {Path(p).name for p in reads} >= {"libc.so.6", "libcudart.so"}


def _rewrite(path: Path, **changes: object) -> None:
    document = orjson.loads(path.read_bytes())
    document.update(changes)
    path.write_bytes(orjson.dumps(document))


def test_another_format_version_is_ignored(
    node: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    learn(node, cache)
    _rewrite(cache / verdictcache.FILE_NAME, version=verdictcache.FORMAT_VERSION + 1)
    with caplog.at_level(logging.DEBUG, logger="gpuflight.producer.discover.verdictcache"):
        assert len(procmaps.open_verdict_store(cache)) == 0
    assert [r.levelno for r in caplog.records if "ignored" in str(r.msg)] == [logging.INFO]
    assert f"format version {verdictcache.FORMAT_VERSION + 1}" in caplog.text


def _valid(tmp_path: Path) -> bytes:
    store = procmaps.open_verdict_store(tmp_path / "valid")
    store.put(identity(1), NOTHING)
    store.put(identity(2), verdictcache.Stored(frozenset({"cudaMalloc"}), frozenset(), False, None,
                                           attachplan.Plan("runtime", (("cudaMalloc", 64),))))
    assert store.save_if_dirty()
    return (tmp_path / "valid" / verdictcache.FILE_NAME).read_bytes()


def _entries(rows: list[object]) -> bytes:
    return orjson.dumps(
        {
            "format": "gpuflight-verdicts",
            "version": verdictcache.FORMAT_VERSION,
            "fingerprint": procmaps.verdict_fingerprint(),
            "entries": rows,
        }
    )


_IDENTITY = [2049, 7, 4096, 5, 5, 9]
DAMAGED = {
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 2],
    "one byte short": lambda good: good[:-1],
    "garbage": lambda good: bytes(range(256)) * 40,
    "not utf-8": lambda good: good.replace(b"gpuflight", b"gpu\xfflight"),
    "a list": lambda good: b"[1, 2, 3]",
    "a string": lambda good: b'"verdicts"',
    "deep nesting": lambda good: b"[" * 100_000 + b"]" * 100_000,
    "null entries": lambda good: good.replace(b'"entries":[', b'"entries":null,"x":['),
    "short entry": lambda good: _entries([[1, 2, 3]]),
    "entry not a list": lambda good: _entries([{"dev": 1}]),
    "negative number": lambda good: _entries([[2049, -7, 4096, 5, 5, 9]]),
    "float": lambda good: _entries([[2049, 7.5, 4096, 5, 5, 9]]),
    "bool as a number": lambda good: _entries([[2049, True, 4096, 5, 5, 9]]),
    "huge number": lambda good: _entries([]).replace(b"[]", b"[[2049,7,4096,5,5,1e400]]"),
    "unprobed name": lambda good: _entries([[*_IDENTITY, None, ["system"], [], None, None, []]]),
    "name not a string": lambda good: _entries(
        [[*_IDENTITY, None, [["cudaMalloc"]], [], None, None, []]]
    ),
    "driver name as runtime": lambda good: _entries(
        [[*_IDENTITY, None, ["cuLaunchKernel"], [], None, None, []]]
    ),
    "loader not a bool": lambda good: _entries([[*_IDENTITY, 1, [], [], None, None, []]]),
    "names not a list": lambda good: _entries(
        [[*_IDENTITY, None, "cudaMalloc", [], None, None, []]]),
    "a version 1 entry": lambda good: _entries([[*_IDENTITY, None, ["cudaMalloc"], [], None]]),
    "a version 3 entry": lambda good: _entries(
        [[*_IDENTITY, None, ["cudaMalloc"], [], None, None]]),
    "unprobed hook": lambda good: _entries([[*_IDENTITY, None, [], [], None, None, ["system"]]]),
    "hooks not a list": lambda good: _entries([[*_IDENTITY, None, [], [], None, None, "_exit"]]),
}
# A runtime's entry (a 4096-byte file defining cudaMalloc) with each of these plans.
BAD_PLANS: dict[str, object] = {
    "not a list": "runtime",
    "too short": ["runtime", {"cudaMalloc": 64}],
    "a version 2 plan": ["runtime", {"cudaMalloc": 64}, 0],
    "unknown kind": ["kernel", {"cudaMalloc": 64}, 0, {}, []],
    "kind not a string": [1, {"cudaMalloc": 64}, 0, {}, []],
    "offsets not an object": ["runtime", [["cudaMalloc", 64]], 0, {}, []],
    "offset at the file's end": ["runtime", {"cudaMalloc": 4096}, 0, {}, []],
    "offset past the file": ["runtime", {"cudaMalloc": 1 << 40}, 0, {}, []],
    "negative offset": ["runtime", {"cudaMalloc": -64}, 0, {}, []],
    "float offset": ["runtime", {"cudaMalloc": 64.0}, 0, {}, []],
    "bool offset": ["runtime", {"cudaMalloc": True}, 0, {}, []],
    "string offset": ["runtime", {"cudaMalloc": "64"}, 0, {}, []],
    "unprobed name": ["runtime", {"system": 64}, 0, {}, []],
    "driver name in a runtime plan": ["runtime", {"cuLaunchKernel": 64}, 0, {}, []],
    "loader name in a driver plan": ["driver", {"_dl_debug_state": 64}, 0, {}, []],
    "runtime name in a loader plan": ["loader", {"cudaMalloc": 64}, 0, {}, []],
    "cookie in a runtime plan": ["runtime", {"cudaMalloc": 64}, 8, {}, []],
    "negative cookie": ["loader", {"_dl_debug_state": 64}, -8, {}, []],
    "cookie past u64": b'["loader", {"_dl_debug_state": 64}, 18446744073709551616, {}, []]',
    "cookie not a number": ["loader", {"_dl_debug_state": 64}, "8", {}, []],
    # A probe moved past its function's entry (producer/discover/entrypoint.py) goes a little
    # further,
    # never before it nor further than attachplan moves one; a stepped one is a planned one.
    "moved further than any move": ["runtime", {"cudaMalloc": 64 + attachplan.MAX_MOVE_BYTES
                                                + 1}, 0, {"cudaMalloc": 64}, []],
    "moved before its entry": ["runtime", {"cudaMalloc": 64}, 0, {"cudaMalloc": 80}, []],
    "moved to its entry": ["runtime", {"cudaMalloc": 64}, 0, {"cudaMalloc": 64}, []],
    "moved, not probed": ["runtime", {"cudaMalloc": None}, 0, {"cudaMalloc": 54}, []],
    "moved, not planned": ["runtime", {"cudaMalloc": 64}, 0, {"cudaFree": 54}, []],
    "entry not a number": ["runtime", {"cudaMalloc": 64}, 0, {"cudaMalloc": "54"}, []],
    "moves not an object": ["runtime", {"cudaMalloc": 64}, 0, [["cudaMalloc", 54]], []],
    "stepped, unprobed name": ["runtime", {"cudaMalloc": 64}, 0, {}, ["system"]],
    "stepped, not planned": ["runtime", {"cudaMalloc": 64}, 0, {}, ["cudaFree"]],
    "stepped not a list": ["runtime", {"cudaMalloc": 64}, 0, {}, "cudaMalloc"],
}


def _planned(plan: object) -> Callable[[bytes], bytes]:
    if isinstance(plan, bytes):  # JSON that orjson would not write
        return lambda good: _entries(
            [[*_IDENTITY, None, ["cudaMalloc"], [], None, "?", []]]).replace(b'"?"', plan)
    return lambda good: _entries([[*_IDENTITY, None, ["cudaMalloc"], [], None, plan, []]])


DAMAGED.update({f"plan: {what}": _planned(plan) for what, plan in BAD_PLANS.items()})


@pytest.mark.parametrize("damage", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_file_is_ignored_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object
) -> None:
    good = _valid(tmp_path)
    assert len(verdictcache.VerdictStore.load(tmp_path / "valid", *_args())) == 2
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / verdictcache.FILE_NAME
    assert callable(damage)
    path.write_bytes(damage(good))
    path.chmod(0o600)
    with caplog.at_level(logging.DEBUG, logger="gpuflight.producer.discover.verdictcache"):
        store = procmaps.open_verdict_store(cache)
    assert len(store) == 0
    ignored = [r for r in caplog.records if "ignored" in str(r.msg)]
    assert len(ignored) == 1 and "\n" not in ignored[0].getMessage() and not ignored[0].exc_info
    # The next save replaces it with a good one.
    store.put(identity(3), NOTHING)
    assert store.save_if_dirty()
    assert procmaps.open_verdict_store(cache).get(identity(3)) == NOTHING


def _args() -> tuple[str, verdictcache.Vocabulary]:
    return procmaps.verdict_fingerprint(), vocabulary()


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_file_others_may_write_is_ignored(
    node: Node, tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    learn(node, cache)
    (cache / verdictcache.FILE_NAME).chmod(mode)
    with caplog.at_level(logging.INFO, logger="gpuflight.producer.discover.verdictcache"):
        assert len(procmaps.open_verdict_store(cache)) == 0
    assert "writable by others" in caplog.text


def test_a_file_someone_else_owns_is_ignored(
    node: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    require(None if os.geteuid() == 0 else "needs root to give a file away (chown)")
    cache = tmp_path / "cache"
    learn(node, cache)
    os.chown(cache / verdictcache.FILE_NAME, 65534, 65534)
    with caplog.at_level(logging.INFO, logger="gpuflight.producer.discover.verdictcache"):
        assert len(procmaps.open_verdict_store(cache)) == 0
    assert "owned by uid 65534" in caplog.text


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_folder_others_may_write_to_is_not_trusted(
    node: Node, tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    learn(node, cache)
    cache.chmod(mode)  # anyone could have swapped the file (say, for an old one of ours)
    with caplog.at_level(logging.INFO, logger="gpuflight.producer.discover.verdictcache"):
        assert len(procmaps.open_verdict_store(cache)) == 0
    assert "in a folder others may write to" in caplog.text
    cache.chmod(mode | stat.S_ISVTX)  # sticky, as /tmp: only the file's owner may replace it
    assert len(procmaps.open_verdict_store(cache)) == 3


def test_a_folder_someone_else_owns_is_not_trusted(
    node: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    require(None if os.geteuid() == 0 else "needs root to give a folder away (chown)")
    # Root trusts no one else's folder; a user trusts its own and root's.
    cache = tmp_path / "cache"
    learn(node, cache)
    os.chown(cache, 65534, 65534)
    with caplog.at_level(logging.INFO, logger="gpuflight.producer.discover.verdictcache"):
        assert len(procmaps.open_verdict_store(cache)) == 0
    assert "in a folder owned by uid 65534" in caplog.text


def test_a_symbolic_link_is_not_followed(node: Node, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    learn(node, cache)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.replace(cache / verdictcache.FILE_NAME, elsewhere / verdictcache.FILE_NAME)
    (cache / verdictcache.FILE_NAME).symlink_to(elsewhere / verdictcache.FILE_NAME)
    assert len(procmaps.open_verdict_store(elsewhere)) == 3  # the file itself is good
    assert len(procmaps.open_verdict_store(cache)) == 0


# --- bounds and writes --------------------------------------------------------------------------


def test_the_oldest_used_entries_go_first(tmp_path: Path) -> None:
    clock = Clock()
    cache = tmp_path / "cache"
    store = verdictcache.VerdictStore.load(cache, *_args(), max_entries=3, clock=clock)
    for n in range(3):
        clock.now += 1
        store.put(identity(n), NOTHING)
    clock.now += 1
    assert store.get(identity(0)) == NOTHING  # used: now the newest
    clock.now += 1
    store.put(identity(3), NOTHING)
    assert store.save_if_dirty()
    document = orjson.loads((cache / verdictcache.FILE_NAME).read_bytes())
    assert len(document["entries"]) == 3
    kept = verdictcache.VerdictStore.load(cache, *_args(), max_entries=3, clock=clock)
    assert [kept.get(identity(n)) is not None for n in range(4)] == [True, False, True, True]


def test_memory_stays_bounded_between_saves(tmp_path: Path) -> None:
    store = verdictcache.VerdictStore.load(tmp_path / "cache", *_args(), max_entries=100)
    for n in range(1000):
        store.put(identity(n), NOTHING)
        assert len(store) <= 125
    assert store.get(identity(999)) == NOTHING


def test_a_smaller_bound_applies_to_a_file_written_with_a_bigger_one(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    store = verdictcache.VerdictStore.load(cache, *_args())
    for n in range(50):
        store.put(identity(n), NOTHING)
    assert store.save_if_dirty()
    assert len(verdictcache.VerdictStore.load(cache, *_args(), max_entries=10)) == 10


def test_a_save_is_atomic_private_and_leaves_no_temporary_file(node: Node, tmp_path: Path) -> None:
    cache = tmp_path / "new" / "cache"
    learn(node, cache)
    assert os.listdir(cache) == [verdictcache.FILE_NAME]
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache / verdictcache.FILE_NAME).stat().st_mode) == 0o600


def test_a_failed_save_leaves_no_temporary_file_and_raises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    store = verdictcache.VerdictStore.load(cache, *_args())
    store.put(identity(1), NOTHING)

    def full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with caplog.at_level(logging.INFO, logger="gpuflight.producer.discover.verdictcache"):
        assert not store.save_if_dirty()
    assert "No space left on device" in caplog.text
    assert os.listdir(cache) == []


def test_a_folder_that_cannot_be_made_costs_only_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a-file").write_text("")
    store = verdictcache.VerdictStore.load(tmp_path / "a-file" / "cache", *_args())
    store.put(identity(1), NOTHING)
    with caplog.at_level(logging.INFO, logger="gpuflight.producer.discover.verdictcache"):
        assert not store.save_if_dirty()
    assert "not saved" in caplog.text


def test_periodic_saves_wait_for_their_interval(tmp_path: Path) -> None:
    clock = Clock()
    cache = tmp_path / "cache"
    store = verdictcache.VerdictStore.load(cache, *_args(), clock=clock)
    store.put(identity(1), NOTHING)
    assert not store.save_if_dirty(min_interval_s=300)
    assert not (cache / verdictcache.FILE_NAME).exists()
    clock.now += 300
    assert store.save_if_dirty(min_interval_s=300)
    assert not store.save_if_dirty(min_interval_s=0)  # nothing new since
    store.put(identity(1), NOTHING)  # known already: nothing new either
    assert not store.dirty


def test_a_store_that_is_off_never_touches_disk(
    node: Node, monkeypatch: pytest.MonkeyPatch, reads: list[str]
) -> None:
    def untouchable(*args: object, **kwargs: object) -> None:
        raise AssertionError("the disk was touched")

    monkeypatch.setattr(verdictcache, "_read_trusted", untouchable)
    monkeypatch.setattr(verdictcache.VerdictStore, "_write", untouchable)
    monkeypatch.setattr(tempfile, "mkstemp", untouchable)
    store = procmaps.open_verdict_store(None)
    assert not store.enabled
    first = node.scan(Classifier(store=store))
    assert len(first) == 2 and len(store) == 0
    assert not store.save_if_dirty()
    elfsyms.clear_cache()
    reads.clear()
    node.scan(Classifier(store=procmaps.open_verdict_store(None)))
    assert {Path(p).name for p in reads} >= {"libc.so.6", "libcudart.so"}  # read again


# --- where ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "euid", "expected"),
    [
        ({"HOME": "/home/ada"}, 0, Path("/var/cache/gpuflight")),
        ({"HOME": "/home/ada"}, 1000, Path("/home/ada/.cache/gpuflight")),
        ({"HOME": "/home/ada", "XDG_CACHE_HOME": "/xdg"}, 1000, Path("/xdg/gpuflight")),
        (
            {"HOME": "/home/ada", "XDG_CACHE_HOME": "relative"},
            1000,
            Path("/home/ada/.cache/gpuflight"),
        ),
        ({"GPUFLIGHT_CACHE_DIR": "/srv/gf"}, 0, Path("/srv/gf")),
        ({"GPUFLIGHT_CACHE_DIR": "/srv/gf"}, 1000, Path("/srv/gf")),
        ({"GPUFLIGHT_CACHE_DIR": ""}, 0, None),
        ({"GPUFLIGHT_CACHE_DIR": "off"}, 1000, None),
        ({"GPUFLIGHT_CACHE_DIR": "OFF"}, 0, None),
    ],
)
def test_where_the_cache_lives(environ: dict[str, str], euid: int, expected: Path | None) -> None:
    assert default_cache_dir(environ, euid) == expected


def test_settings_read_the_cache_folder_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUFLIGHT_CACHE_DIR", str(tmp_path))
    assert CaptureSettings().verdict_cache_dir == tmp_path
    monkeypatch.setenv("GPUFLIGHT_CACHE_DIR", "off")
    assert CaptureSettings().verdict_cache_dir is None
