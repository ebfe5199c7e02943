"""streams/stalls.py: a partition is stalled when its messages wait untaken for stall_s while
the worker takes others; not when it keeps up, moves on, or the whole worker is idle."""

from __future__ import annotations

from gpuflight.streams.stalls import Stall, StallWatch


def test_messages_waiting_untaken_while_others_are_taken_are_a_stall_once() -> None:
    watch = StallWatch(stall_s=20)
    assert watch.check("p0", 5, 9, taken=100, now_s=0) is None  # seen waiting: the clock starts
    assert watch.check("p0", 5, 9, taken=140, now_s=19.9) is None  # not long enough
    assert watch.check("p0", 5, 9, taken=150, now_s=20) == Stall(5, 9, 20)
    # Then watched afresh: another stall_s before it is said again.
    assert watch.check("p0", 5, 9, taken=160, now_s=21) is None
    assert watch.check("p0", 5, 9, taken=170, now_s=40) is None
    assert watch.check("p0", 5, 9, taken=180, now_s=41) == Stall(5, 9, 20)


def test_a_partition_that_moves_or_keeps_up_is_no_stall() -> None:
    watch = StallWatch(stall_s=20)
    assert watch.check("p0", 5, 9, taken=100, now_s=0) is None
    assert watch.check("p0", 6, 9, taken=110, now_s=19) is None  # one taken: the clock restarts
    assert watch.check("p0", 6, 9, taken=120, now_s=30) is None
    assert watch.check("p0", 9, 9, taken=130, now_s=45) is None  # caught up
    assert watch.check("p0", 9, 12, taken=140, now_s=46) is None  # new messages: from now
    assert watch.check("p0", 9, 12, taken=150, now_s=65) is None
    assert watch.check("p0", 9, 12, taken=160, now_s=66) == Stall(9, 12, 20)


def test_a_worker_that_takes_nothing_at_all_is_busy_not_stalled() -> None:
    # Its agent is held up (a slow sink): every partition waits; reading one again would not help.
    watch = StallWatch(stall_s=20)
    assert watch.check("p0", 5, 9, taken=100, now_s=0) is None
    assert watch.check("p0", 5, 9, taken=100, now_s=60) is None
    assert watch.check("p0", 5, 9, taken=101, now_s=61) == Stall(5, 9, 61)


def test_partitions_are_watched_apart_and_forgotten_on_a_rebalance() -> None:
    watch = StallWatch(stall_s=20)
    assert watch.check("p0", 5, 9, taken=0, now_s=0) is None
    assert watch.check("p1", 3, 4, taken=0, now_s=10) is None
    assert watch.check("p0", 5, 9, taken=1, now_s=25) == Stall(5, 9, 25)
    assert watch.check("p1", 3, 4, taken=2, now_s=25) is None  # 15 s only
    watch.forget()
    assert watch.check("p1", 3, 4, taken=3, now_s=31) is None  # watched afresh
    assert watch.check("p1", 3, 4, taken=4, now_s=51) == Stall(3, 4, 20)
