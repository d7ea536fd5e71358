"""search/budget.py: one clock for a search's run, and every phase's share of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.core.paired import MIN_ROUNDS
from autotune.search.budget import (
    ALONE_OVERHEAD_S,
    ALONE_TIMED_S,
    CEILING_S,
    Budget,
    alone_reserve_s,
    ceiling_reserve_s,
    confirm_reserve_s,
    grace_s,
    least_confirming_budget_s,
    parity_reserve_s,
)

TINY = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, warmup_steps=1, timed_steps=3, window=1)


def test_the_confirmation_reserve_is_bounded_by_half_the_budget() -> None:
    s = SearchSettings(budget_s=100.0, base=TINY.replace(seconds=5.0))
    assert confirm_reserve_s(s) == 50.0
    assert confirm_reserve_s(dataclasses.replace(s, budget_s=10_000.0)) == 4 * 3 * 15.0
    assert confirm_reserve_s(dataclasses.replace(s, confirm_rounds=0)) == 0.0


def test_the_gate_reserve_is_bounded_by_a_quarter_of_the_budget() -> None:
    s = SearchSettings(budget_s=100.0, base=TINY.replace(seconds=5.0))
    assert parity_reserve_s(s) == 25.0
    assert parity_reserve_s(dataclasses.replace(s, budget_s=10_000.0)) == 3 * (5.0 + 15.0)
    assert parity_reserve_s(dataclasses.replace(s, parity_steps=0)) == 0.0
    assert parity_reserve_s(dataclasses.replace(s, base=TINY, budget_s=10_000.0)) == 3 * (15.0 + 15.0)  # a guess


def test_grace_is_two_percent_or_thirty_seconds_less_the_export() -> None:
    assert grace_s(None) == 20.0 and grace_s(600.0) == 20.0 and grace_s(7200.0) == pytest.approx(134.0)


def test_every_deadline_comes_from_one_start() -> None:
    s = SearchSettings(budget_s=1000.0, base=TINY.replace(seconds=5.0))
    b = Budget.of(s, started=100.0)
    assert b.reserve_s == confirm_reserve_s(s) + parity_reserve_s(s) == 4 * 3 * 15.0 + 3 * 20.0
    assert b.end == 1100.0 and b.late_end == 1100.0 + grace_s(1000.0)
    assert b.search_deadline == 100.0 + 1000.0 - b.reserve_s
    assert b.search_left(now=200.0) == b.search_deadline - 200.0
    assert b.left_s(now=1000.0) == 100.0 and b.left_s(now=5000.0) == 0.0
    # A reserve larger than half the budget still leaves the trials half of it.
    short = Budget.of(SearchSettings(budget_s=60.0, base=TINY), started=0.0)
    assert short.search_deadline == 30.0


def test_the_trial_loop_stops_when_the_median_trial_would_overrun() -> None:
    b = Budget.of(SearchSettings(budget_s=600.0, trial_timeout_s=300.0), started=0.0)
    assert b.trials_over(0.0, []) and not b.trials_over(10.0, [])
    assert not b.trials_over(10.0, [25.0, 30.0]) and b.trials_over(10.0, [40.0, 50.0])  # median vs left + 20 s
    assert b.trial_timeout(10.0) == 30.0 and b.trial_timeout(1e9) == 300.0


def test_no_budget_has_no_deadlines() -> None:
    b = Budget.of(SearchSettings(budget_s=None, n_trials=3))
    assert b.end is None and b.late_end is None and b.search_deadline is None and b.left_s() is None
    assert b.search_left() == float("inf") and b.reserve_s == 0.0
    assert Budget.fits(1e9, b.end) and not Budget.fits(10.0, 5.0, now=0.0) and Budget.fits(5.0, 5.0, now=0.0)


def test_the_trial_loop_s_share_counts_from_when_it_begins() -> None:
    """The warm server's start-up comes out of the end's share, not the trials' (as before one Budget)."""
    b = Budget.of(SearchSettings(budget_s=1000.0, base=TINY.replace(seconds=5.0)), started=100.0)
    late = b.trials_begin(now=130.0)
    assert late.search_deadline == b.search_deadline + 30.0 and late.end == b.end and late.late_end == b.late_end


def test_the_ceiling_keeps_its_share_after_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The export's ceiling is measured last, so the gate and the extension rounds end early enough for it."""
    monkeypatch.setenv("AUTOTUNE_CEILING", "1")  # the suite turns it off (tests/conftest.py)
    s = SearchSettings(budget_s=600.0, base=TINY.replace(seconds=5.0))
    assert ceiling_reserve_s(s) == CEILING_S and ceiling_reserve_s(dataclasses.replace(s, budget_s=60.0)) == 6.0
    b = Budget.of(s, started=0.0)
    assert b.reserve_s == confirm_reserve_s(s) + parity_reserve_s(s) + CEILING_S
    assert b.checks_end == b.late_end - CEILING_S and b.late_end == 600.0 + grace_s(600.0)
    # Nothing kept where no ceiling is measured: turned off, a job in its own loop, no budget.
    assert ceiling_reserve_s(dataclasses.replace(s, base=TINY.replace(pipeline="lightning:my.module:Model"))) == 0.0
    assert ceiling_reserve_s(dataclasses.replace(s, budget_s=None)) == 0.0
    monkeypatch.setenv("AUTOTUNE_CEILING", "0")
    assert Budget.of(s, started=0.0).checks_end == Budget.of(s, started=0.0).late_end


def test_a_script_study_keeps_a_share_for_its_alone_rounds_after_everything_else(tmp_path: Path) -> None:
    """The script as written against the export applied, each run alone, is the last word: the trial loop,
    confirmation, the gate and the ceiling all end early enough for MIN_ROUNDS rounds of it."""
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    s = SearchSettings(budget_s=1000.0, base=TINY.replace(pipeline=f"script:{script}", seconds=5.0))
    assert alone_reserve_s(s) == MIN_ROUNDS * 2 * (ALONE_OVERHEAD_S + ALONE_TIMED_S) == 150.0
    assert alone_reserve_s(dataclasses.replace(s, budget_s=200.0)) == 50.0  # at most a quarter
    b = Budget.of(s, started=0.0)
    assert b.alone_reserve_s == 150.0 and b.reserve_s == confirm_reserve_s(s) + parity_reserve_s(s)
    assert b.search_deadline == 1000.0 - b.reserve_s - 150.0
    assert b.confirm_end == 1000.0 - 150.0 and b.ceiling_end == b.late_end - 150.0 and b.checks_end == b.ceiling_end
    # Nothing kept for another kind of job, or without a budget.
    assert (
        alone_reserve_s(dataclasses.replace(s, base=TINY))
        == 0.0
        == Budget.of(dataclasses.replace(s, base=TINY)).alone_reserve_s
    )
    assert alone_reserve_s(dataclasses.replace(s, budget_s=None)) == 0.0


def test_at_a_short_budget_the_end_s_shares_are_cut_together_to_half(tmp_path: Path) -> None:
    """A 6-minute script study wants more than half its budget for confirmation, the gate, the ceiling and
    the alone rounds: the alone rounds keep theirs (its last word; at most a quarter), the others are cut in
    proportion to the rest, so together they are half, and each phase's deadline leaves the next its share
    (before, confirmation's half and the trials' half left the rest none)."""
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    s = SearchSettings(budget_s=360.0, base=TINY.replace(pipeline=f"script:{script}", seconds=5.0))
    wanted = [confirm_reserve_s(s), parity_reserve_s(s), ceiling_reserve_s(s), alone_reserve_s(s)]
    assert sum(wanted) > 180.0
    b = Budget.of(s, started=0.0)
    got = [b.confirm_reserve_s, b.parity_reserve_s, b.ceiling_reserve_s, b.alone_reserve_s]
    assert sum(got) == pytest.approx(180.0) and b.search_deadline == pytest.approx(180.0)
    assert b.alone_reserve_s == alone_reserve_s(s) == 90.0  # a quarter of 360 s
    cut = (180.0 - 90.0) / sum(wanted[:3])
    assert [g / w for g, w in zip(got[:3], wanted[:3]) if w] == pytest.approx([cut] * sum(map(bool, wanted[:3])))
    assert b.confirm_end == pytest.approx(360.0 - b.alone_reserve_s)
    assert b.checks_end == pytest.approx(b.late_end - b.alone_reserve_s - b.ceiling_reserve_s)
    # A long budget keeps what each phase wants.
    s = dataclasses.replace(s, budget_s=7200.0)
    long = Budget.of(s, started=0.0)
    assert long.alone_reserve_s == alone_reserve_s(s) and long.confirm_reserve_s == confirm_reserve_s(s)


def test_a_budget_too_short_to_confirm_anything_is_said_after_trial_0_with_the_one_that_can() -> None:
    """Below the least confirming budget, what the trials leave cannot pay for 3 rounds of even one config
    beside the baseline, so only the baseline can be exported: said once trial 0 has shown what a trial
    costs, with the budget that can. Never on a guess: both public-script searches said it at 6 minutes
    on the first guess of 25 s a trial, then ran 3 rounds and one exported a change."""
    from autotune.search.loop.finish import reserve_note, short_note

    s = SearchSettings(budget_s=180.0, base=TINY.replace(seconds=15.0))
    least = least_confirming_budget_s(s, 25.0)
    assert least is not None and least % 60 == 0 and least == least_confirming_budget_s(s)  # the guess: 25 s
    need = 2 * MIN_ROUNDS * 25.0
    assert Budget.of(dataclasses.replace(s, budget_s=least)).reserve_s >= need
    assert Budget.of(dataclasses.replace(s, budget_s=least - 60.0)).reserve_s < need
    assert "only the baseline" not in (reserve_note(s, Budget.of(s)) or "")  # nothing said before a trial
    short = short_note(s, Budget.of(s), 25.0)
    assert short is not None and least > 180.0 and "at 25 s a trial (trial 0's, launch to result)" in short
    assert f"this search can export only the baseline's own config; --budget {least / 60:.0f}m or more pays" in short
    enough = dataclasses.replace(s, budget_s=least)
    assert short_note(enough, Budget.of(enough), 25.0) is None
    assert short_note(s, Budget.of(s), 8.0) is None  # trials of 8 s: 3 rounds of one config fit in 180 s
    assert least_confirming_budget_s(dataclasses.replace(s, confirm_rounds=0)) is None


def test_a_script_study_whose_rounds_would_take_its_alone_share_says_so_after_trial_0(tmp_path: Path) -> None:
    """Seen on three public scripts at 6 minutes: "alone: 90 s kept ...", then "confirmation: takes the alone
    rounds' share", and the change exported was never run alone against the script. Where the rounds fit only
    with that share, it is said once trial 0 has shown a trial's cost, with the budget that pays for both."""
    from autotune.search.loop.finish import short_note

    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    s = SearchSettings(budget_s=360.0, base=TINY.replace(pipeline=f"script:{script}", seconds=15.0))
    least = least_confirming_budget_s(s, 25.0)
    both = least_confirming_budget_s(s, 25.0, alone_kept=True)
    assert least is not None and both is not None and least < both  # the alone share is what lies between
    at = dataclasses.replace(s, budget_s=least)
    note = short_note(at, Budget.of(at), 25.0)
    assert note is not None and note.startswith("alone: at 25 s a trial") and f"--budget {both / 60:.0f}m" in note
    paid = dataclasses.replace(s, budget_s=both)
    assert Budget.of(paid).reserve_s >= 2 * MIN_ROUNDS * 25.0  # the rounds fit and leave the alone share whole
    assert short_note(paid, Budget.of(paid), 25.0) is None
    plain = dataclasses.replace(at, base=TINY.replace(seconds=15.0))  # no alone rounds: nothing to say
    assert short_note(plain, Budget.of(plain), 25.0) is None
