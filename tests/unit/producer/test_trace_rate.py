"""trace's summary line of the stack sampler: the walks of known stacks (what the cost budget
keeps to) apart from the first walk of each new stack (a one-off the rate does not follow)."""

from __future__ import annotations

from gpuflight.producer.probe.probes import StackRate
from gpuflight.producer.trace import StackOptions, _rate_words


def test_the_budget_s_figures_are_the_known_stacks_walks_and_new_ones_are_given_apart() -> None:
    rate = StackRate(peak=256, raised=5, calls=50_000, walks=305, spent_ns=300_000 + 250_000,
                     new_walks=5, new_spent_ns=250_000)
    words = _rate_words(StackOptions(budget_ns=8), rate)
    assert words == ("1 call in 164 walked on average (the rate kept the walks of known stacks"
                     " to 8 ns a recorded call: they took 6 ns, 1,000 ns a walk; the first"
                     " walks of 5 new stack(s), which it does not follow, 5 ns more, 50,000 ns"
                     " each; a CPU's period reached 256)")


def test_new_stacks_alone_say_so_and_no_new_stack_says_nothing_of_them() -> None:
    only_new = _rate_words(StackOptions(budget_ns=40), StackRate(
        peak=1, calls=3, walks=3, spent_ns=60_000, new_walks=3, new_spent_ns=60_000))
    assert ": none walked yet; the first walks of 3 new stack(s)" in only_new
    none_new = _rate_words(StackOptions(budget_ns=40), StackRate(
        peak=4, calls=400, walks=100, spent_ns=100_000))
    assert none_new.endswith("they took 250 ns, 1,000 ns a walk; a CPU's period reached 4)")
