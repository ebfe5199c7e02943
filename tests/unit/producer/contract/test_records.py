"""Records taken and joined whole rows at a time are what numpy's own field-by-field copies give."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuflight.producer.contract import records
from gpuflight.producer.contract.abi import EVENT_DTYPE, NAME_EVENT_DTYPE, SLOT_DTYPE


def _events(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    events = np.zeros(n, dtype=EVENT_DTYPE)
    raw = events.view(np.uint8).reshape(n, EVENT_DTYPE.itemsize)
    raw[:] = rng.integers(0, 256, size=raw.shape, dtype=np.uint8)  # the padding too
    return events


@given(st.integers(0, 200), st.integers(0, 2**32 - 1))
def test_take_is_fancy_indexing_and_masking(n: int, seed: int) -> None:
    events = _events(n, seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    mask = rng.random(n) < 0.5
    for index in (order, mask, order[: n // 2]):
        got, want = records.take(events, index), events[index]
        assert got.dtype == EVENT_DTYPE
        assert np.array_equal(got, want)
        got["pid"] += 1  # a copy: the records it was taken from are not changed
        assert np.array_equal(events[index], want)


@given(st.integers(0, 200), st.integers(0, 2**32 - 1))
def test_split_is_the_two_masks(n: int, seed: int) -> None:
    events = _events(n, seed)
    later = np.random.default_rng(seed).random(n) < 0.3
    earlier, rest = records.split(events, later)
    assert np.array_equal(earlier, events[~later]) and np.array_equal(rest, events[later])
    assert earlier.dtype == rest.dtype == EVENT_DTYPE
    nothing_later = np.zeros(n, dtype=bool)
    earlier, rest = records.split(events, nothing_later)
    assert earlier is events and len(rest) == 0 and rest.dtype == EVENT_DTYPE


@given(st.lists(st.integers(0, 50), min_size=1, max_size=5), st.integers(0, 2**32 - 1))
def test_join_is_concatenate(sizes: list[int], seed: int) -> None:
    parts = [_events(n, seed + i) for i, n in enumerate(sizes)]
    got = records.join(parts)
    assert got.dtype == EVENT_DTYPE
    assert np.array_equal(got, np.concatenate(parts))


def test_a_strided_view_and_other_record_types() -> None:
    """The events inside each CPU's buffer's slots (a view 96 bytes apart), and names."""
    slots = np.zeros(6, dtype=SLOT_DTYPE)
    slots["ev"]["pid"] = np.arange(6)
    slots["ev"]["dim"][:, 5] = np.arange(6) * 10
    inside = slots["ev"]
    assert inside.strides == (SLOT_DTYPE.itemsize,)
    got = records.take(inside, np.array([5, 1]))
    assert got["pid"].tolist() == [5, 1] and got["dim"][:, 5].tolist() == [50, 10]
    names = np.zeros(3, dtype=NAME_EVENT_DTYPE)
    names["name"] = [b"a", b"bb", b"ccc"]
    assert records.join([names, names[1:]])["name"].tolist() == [b"a", b"bb", b"ccc", b"bb",
                                                                  b"ccc"]
    assert records.take(names, names["name"] != b"bb")["name"].tolist() == [b"a", b"ccc"]


def test_records_of_other_dtypes_are_not_joined() -> None:
    """88 bytes of something else are not events: concatenate would have refused them too."""
    other = np.zeros(2, dtype=np.dtype((np.void, EVENT_DTYPE.itemsize)))
    with pytest.raises(ValueError, match="different dtypes"):
        records.join([_events(2, 0), other])
