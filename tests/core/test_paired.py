"""The paired-rounds interval: the sign test's order statistics, its coverage, and the verdict's words."""

from __future__ import annotations

import pytest

from autotune.core.paired import MIN_ROUNDS, Paired, coverage


def test_coverage_is_the_sign_tests():
    assert coverage(3, 1) == pytest.approx(0.75)
    assert coverage(4, 1) == pytest.approx(0.875)
    assert coverage(5, 1) == pytest.approx(1 - 2 / 32)
    assert coverage(8, 2) == pytest.approx(1 - 2 * 9 / 256)


def test_few_rounds_keep_the_range_and_say_its_coverage():
    p = Paired.of([1.3, 1.1, 1.2])
    assert p.interval == (1.1, 1.3)
    assert p.coverage == pytest.approx(0.75)
    assert "75% sign-test interval, 3 rounds" in p.figure()


def test_many_rounds_narrow_the_interval_to_the_confidence():
    p = Paired.of([0.8, 1.05, 1.1, 1.12, 1.15, 1.2, 1.25, 1.3, 1.4, 1.6])
    k = p.depth
    assert k > 1 and p.coverage >= 0.90 and coverage(10, k + 1) < 0.90
    assert p.interval == (sorted(p.ratios)[k - 1], sorted(p.ratios)[10 - k])
    assert p.measurable  # one slow outlier does not undo nine faster rounds


def test_two_rounds_faster_in_both_are_not_a_gain():
    p = Paired.of([1.3, 1.25])
    assert MIN_ROUNDS == 3 and not p.measurable and p.direction is None
    assert p.statement().startswith("no measurable gain yet")


def test_an_interval_holding_one_is_no_measurable_gain():
    p = Paired.of([1.2, 0.95, 1.1, 1.3])
    assert not p.measurable
    assert p.statement().startswith("no measurable gain over the baseline on this machine")


def test_clear_of_one_says_which_way():
    assert (
        Paired.of([1.2, 1.1, 1.3])
        .statement(than="the script as written")
        .startswith("faster than the script as written: x1.20")
    )
    slow = Paired.of([0.8, 0.9, 0.85])
    assert slow.direction == "slower" and not slow.measurable
    assert slow.to_dict()["interval"] == [0.8, 0.9]


def test_thin_rounds_must_clear_the_references_own_spread() -> None:
    """Seen on a public script: 3 rounds "confirmed" x1.46 (x1.06..x1.46, 75%) beside a baseline whose own
    rounds spread to x1.34; alone, the change ran x0.93. Below 90% coverage the interval must clear that."""
    thin = Paired.of([1.06, 1.46, 1.40], noise=1.34)
    assert not thin.measurable and "does not clear the baseline's own spread" in thin.statement()
    assert Paired.of([1.06, 1.46, 1.40]).measurable  # a quiet reference: the interval alone decides
    assert Paired.of([1.40, 1.46, 1.42], noise=1.34).measurable
    many = Paired.of([1.06, 1.46, 1.40, 1.2, 1.3, 1.25, 1.1], noise=1.34)  # 7 rounds: 98% coverage
    assert many.coverage >= 0.9 and many.measurable
