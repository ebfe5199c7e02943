"""Samples to code paths: a head read before its stack's frames waits for them; one whose
frames never come is counted unknown, not lost silently; a process with no CPython is one
frame that says so."""

from __future__ import annotations

import numpy as np

from gpuflight.producer.decode.pysamples import (
    NEW,
    NO_FRAMES,
    NO_PYTHON,
    UNKNOWN,
    StackSamples,
    head_dtype,
    stack_dtype,
)

DEPTH = 8


def _heads(*stacks: tuple[int, int]) -> np.ndarray:
    heads = np.zeros(len(stacks), head_dtype())
    for i, (stack_id, weight) in enumerate(stacks):
        heads[i]["pid"], heads[i]["stack_id"], heads[i]["weight"] = 7, stack_id, weight
    return heads


def _frames(stack_id: int, flags: int = NEW, depth: int = 2) -> np.ndarray:
    whole = np.zeros(1, stack_dtype(DEPTH))
    whole[0]["pid"], whole[0]["stack_id"], whole[0]["flags"] = 7, stack_id, flags
    whole[0]["depth"] = depth
    whole[0]["code"][:depth] = [0x1000 + i for i in range(depth)]
    return whole


def test_heads_wait_for_their_frames_and_the_rest_are_counted_unknown() -> None:
    samples = StackSamples(DEPTH, lambda pid: None, lambda pid: None)
    samples.add_samples(_heads((1, 10), (1, 10), (2, 5)))  # read before the frames
    samples.add_frames(_frames(1))
    samples.add_samples(_heads((1, 10)))
    (path,) = samples.samples()
    assert path.values == {"launches": 30.0}
    assert path.frames == (UNKNOWN, UNKNOWN)  # no layout known: named as unknown code
    assert samples.unknown_stacks == 1  # stack 2's frames never came


def test_a_process_with_no_cpython_is_one_frame_that_says_so() -> None:
    samples = StackSamples(DEPTH, lambda pid: None, lambda pid: None)
    samples.add_frames(_frames(3, flags=NEW | NO_PYTHON, depth=0))
    samples.add_samples(_heads((3, 1)))
    (path,) = samples.samples()
    assert path.frames == (NO_FRAMES,) and path.values == {"launches": 1.0}
