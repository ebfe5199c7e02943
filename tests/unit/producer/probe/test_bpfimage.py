"""The compiled-program cache (producer/probe/bpfimage.py): where map fds go in the instructions,
what a kept image must match to be used, and what is never trusted. Pure: no BPF here;
tests/system/test_capture.py runs a trace from a kept image, tests/system/test_kafka.py a node
agent."""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import orjson
import pytest

from gpuflight.producer.probe import bpfimage
from gpuflight.producer.probe.bpfimage import Image, ImageCache, ImageError, MapSpec, ProgramSpec


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def map_load(fd: int, dst: int = 1) -> bytes:
    """ld_imm64 rDST, map fd (BPF_PSEUDO_MAP_FD): two instructions."""
    return insn(0x18, dst, 1, 0, fd) + insn(0)


def const_load(value: int) -> bytes:
    return insn(0x18, 2, 0, 0, value & 0xFFFFFFFF) + insn(0, imm=value >> 32)


EXIT = insn(0xB7, 0, 0, 0, 0) + insn(0x95)  # r0 = 0; exit


def sample_image() -> Image:
    insns = map_load(7) + const_load(0x1234_5678_9ABC) + map_load(9, dst=3) + EXIT
    relocs = bpfimage.relocations(insns, {7: 0, 9: 1})
    return Image("GPL", 0x060100, (
        MapSpec("events", 27, 0, 0, 1 << 22, 0),
        MapSpec("scope_pids", 1, 4, 1, 65536, 0),
    ), (ProgramSpec("on_launch", insns, relocs), ProgramSpec("other", EXIT, ())))


def test_map_loads_are_found_and_plain_constants_are_not() -> None:
    insns = map_load(7) + const_load(7) + map_load(9, dst=3) + EXIT
    assert bpfimage.relocations(insns, {7: 0, 9: 1}) == ((0, 0), (4, 1))


def test_fds_go_back_in_where_the_map_loads_are() -> None:
    spec = sample_image().program("on_launch")
    out = spec.with_fds([42, 43])
    words = struct.unpack(f"<{len(out) // 8}Q", out)
    assert words[0] >> 32 == 42 and words[4] >> 32 == 43
    assert words[0] & 0xFFFFFFFF == struct.unpack("<Q", map_load(7)[:8])[0] & 0xFFFFFFFF
    assert out[8:32] == spec.insns[8:32]  # the constant and second halves untouched


@pytest.mark.parametrize(("insns", "why"), [
    (map_load(5) + EXIT, "no map of the program"),
    (insn(0x18, 1, 2, 0, 7) + insn(0) + EXIT, "pseudo constant of kind 2"),
    (EXIT + insn(0x18, 1, 1, 0, 7), "without its second half"),
    (EXIT[:12], "not whole"),
])
def test_what_an_image_cannot_carry_is_refused(insns: bytes, why: str) -> None:
    with pytest.raises(ImageError, match=why):
        bpfimage.relocations(insns, {7: 0})


def test_an_image_reads_back_as_written() -> None:
    image = sample_image()
    assert bpfimage.decode(bpfimage.encode(image, "k" * 64), "k" * 64) == image


def test_the_key_follows_source_cflags_and_compiler() -> None:
    base = bpfimage.image_key("int x;", ["-DA=1"], ["kernel 6.1"])
    assert base == bpfimage.image_key("int x;", ["-DA=1"], ["kernel 6.1"])
    assert len({base,
                bpfimage.image_key("int y;", ["-DA=1"], ["kernel 6.1"]),
                bpfimage.image_key("int x;", ["-DA=2"], ["kernel 6.1"]),
                bpfimage.image_key("int x;", ["-DA=1"], ["kernel 6.2"]),
                bpfimage.image_key("int x;", [], ["-DA=1", "kernel 6.1"])}) == 5


def test_the_compiler_is_known_by_its_files(tmp_path: Path) -> None:
    lib = tmp_path / "libbcc.so.0"
    lib.write_bytes(b"one")
    before = bpfimage.environment_parts(lib, None)
    assert before[0].startswith(f"kernel {os.uname().release} ")
    lib.write_bytes(b"other")  # another size: an upgraded bcc
    assert bpfimage.environment_parts(lib, None) != before


def _document(image: Image, key: str) -> dict[str, object]:
    doc: dict[str, object] = orjson.loads(bpfimage.encode(image, key))
    return doc


@pytest.mark.parametrize(("change", "why"), [
    (lambda d: d.update(format="x"), "not a gpuflight BPF image"),
    (lambda d: d.update(version=99), "format version 99"),
    (lambda d: d.update(key="0" * 64), "another source"),
    (lambda d: d.update(license=""), "license"),
    (lambda d: d.update(kern_version=True), "kernel version"),
    (lambda d: d["maps"][0].__setitem__(0, "bad name!"), "map of the wrong shape"),
    (lambda d: d["maps"][0].__setitem__(4, -1), "map of the wrong shape"),
    (lambda d: d["programs"][0].__setitem__(1, "***"), "not base64"),
    (lambda d: d["programs"][0].__setitem__(1, "AAAA"), "not whole"),
    (lambda d: d["programs"][0][2].__setitem__(0, [2, 0]), "not one"),  # the constant
    (lambda d: d["programs"][0][2].__setitem__(0, [0, 5]), "not one"),  # no such map
    (lambda d: d["programs"][0][2].__setitem__(0, [0, 0, 0]), "not one"),
    (lambda d: d.update(programs=[]), "no map or program list"),
])
def test_an_image_not_exactly_ours_is_refused(change: object, why: str) -> None:
    key = "a" * 64
    doc = _document(sample_image(), key)
    change(doc)  # type: ignore[operator]
    with pytest.raises(ImageError, match=why):
        bpfimage.decode(orjson.dumps(doc), key)


def test_the_cache_keeps_an_image_per_key(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache")
    key = "b" * 64
    assert cache.load(key) is None
    assert cache.save(key, sample_image())
    assert cache.load(key) == sample_image()
    assert cache.load("c" * 64) is None
    path = cache.path(key)
    assert path is not None and path.stat().st_mode & 0o777 == 0o600


def test_an_image_others_could_have_written_is_ignored(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The kernel runs what the image holds: a file anybody else may write is not used."""
    caplog.set_level(logging.INFO, logger="gpuflight.producer.probe.bpfimage")
    cache = ImageCache(tmp_path)
    key = "d" * 64
    assert cache.save(key, sample_image())
    path = cache.path(key)
    assert path is not None
    path.chmod(0o666)
    assert cache.load(key) is None
    assert "writable by others" in caplog.text
    path.chmod(0o600)
    link = tmp_path / "elsewhere.json"
    path.rename(link)
    path.symlink_to(link)
    assert cache.load(key) is None
    assert "cannot be opened safely" in caplog.text


def test_a_corrupt_image_costs_a_compile_not_the_start(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path)
    key = "e" * 64
    path = cache.path(key)
    assert path is not None
    path.write_bytes(b"{not json")
    path.chmod(0o600)
    assert cache.load(key) is None


def test_the_least_recently_used_images_go(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path, max_images=2)
    keys = [c * 64 for c in "123"]
    for i, key in enumerate(keys):
        assert cache.save(key, sample_image())
        path = cache.path(key)
        assert path is not None
        os.utime(path, ns=(i * 10**9, i * 10**9))
    assert cache.save("4" * 64, sample_image())
    assert sorted(p.name for p in tmp_path.glob("bpf-*.json")) == [
        f"bpf-{'3' * 64}.json", f"bpf-{'4' * 64}.json"]


def test_an_unwritable_folder_costs_only_the_next_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not ImageCache(blocker / "cache").save("f" * 64, sample_image())
    assert ImageCache(None).load("f" * 64) is None
