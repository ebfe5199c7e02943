"""Line tables decoded as CPython decodes them, and walks that end bounded on bad memory (a
cycle, a frame chain deeper than the bound, an address not mapped)."""

from __future__ import annotations

import itertools
import struct
import sys
import types

import pytest

from gpuflight.producer.decode.pystacks import (
    MemoryReadError,
    line_of_locations,
    line_of_ranges,
    walk,
)
from gpuflight.producer.discover.pythons import LAYOUTS


def _sample(n: int) -> int:
    total = 0
    for i in range(n):
        if i % 3:
            total += (
                i
                * 2)
        else:
            try:  # noqa: SIM105 (a try block: its own entries in the line table)
                total -= len(str(i))
            except ValueError:
                pass
    return total


def _codes() -> list[types.CodeType]:
    found = [_sample.__code__, walk.__code__, line_of_locations.__code__]
    found += [c for c in _sample.__code__.co_consts if isinstance(c, types.CodeType)]
    return found


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the location table is 3.11+'s")
@pytest.mark.parametrize("code", _codes(), ids=lambda c: c.co_name)
def test_the_location_table_gives_each_instruction_the_line_cpython_gives(
        code: types.CodeType) -> None:
    lines = [start for start, *_ in code.co_positions()]
    got = [line_of_locations(code.co_linetable, code.co_firstlineno, i)
           for i in range(len(lines))]
    assert got == lines
    assert line_of_locations(code.co_linetable, code.co_firstlineno, len(lines)) is None


def test_pep_626_ranges_give_the_line_of_an_offset() -> None:
    # 3.10: (bytes covered, line delta) pairs; -128 (0x80): no line.
    table = bytes([4, 1, 6, 0x80, 2, 2, 8, 0xFF])
    first = 10
    assert [line_of_ranges(table, first, off) for off in (0, 3, 4, 9, 10, 11, 12, 19)] == [
        11, 11, None, None, 13, 13, 12, 12]
    assert line_of_ranges(table, first, 20) is None


class _FakeMemory:
    """u64 words at addresses; anything else unmapped."""

    def __init__(self, words: dict[int, int]) -> None:
        self.words = words

    def read(self, address: int, size: int) -> bytes:
        out = b""
        for at in range(address - address % 8, address + size, 8):
            if at not in self.words:
                raise MemoryReadError(f"{at:#x}")
            out += struct.pack("<Q", self.words[at])
        skip = address % 8
        return out[skip:skip + size]

    def u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")

    def i32(self, address: int) -> int:
        return int(struct.unpack("<i", self.read(address, 4))[0])


LAYOUT = LAYOUTS[(3, 13)]  # tstate->current_frame; frame: code at 0, previous at 8


def _frames(chain: list[int], previous: dict[int, int]) -> _FakeMemory:
    tstate = 0x1000
    words = {tstate + LAYOUT.tstate_current_frame: chain[0]}
    for frame in chain:
        words[frame + LAYOUT.frame_code] = 0xC0DE0000 + frame
        words[frame + LAYOUT.frame_previous] = previous.get(frame, 0)
        words[frame + LAYOUT.frame_instr] = 0
        words[frame + LAYOUT.frame_owner - LAYOUT.frame_owner % 8] = 0  # owned by a thread
    return _FakeMemory(words)


def test_a_cycle_of_frames_ends_the_walk_truncated() -> None:
    chain = [0x2000, 0x3000, 0x4000]
    memory = _frames(chain, {0x2000: 0x3000, 0x3000: 0x4000, 0x4000: 0x2000})
    seen = walk(memory, LAYOUT, 0x1000)
    assert seen.truncated and [f.code for f in seen.frames] == [0xC0DE0000 + f for f in chain]


def test_a_chain_deeper_than_the_bound_is_cut_there_and_flagged() -> None:
    chain = [0x10000 + 0x100 * i for i in range(10)]
    memory = _frames(chain, dict(itertools.pairwise(chain)))
    assert len(walk(memory, LAYOUT, 0x1000).frames) == 10
    cut = walk(memory, LAYOUT, 0x1000, max_depth=4)
    assert cut.truncated and len(cut.frames) == 4


def test_a_frame_pointing_nowhere_ends_the_walk_truncated() -> None:
    chain = [0x2000, 0x3000]
    memory = _frames(chain, {0x2000: 0x3000, 0x3000: 0x9990000})  # not mapped
    seen = walk(memory, LAYOUT, 0x1000)
    assert seen.truncated and len(seen.frames) == 2
