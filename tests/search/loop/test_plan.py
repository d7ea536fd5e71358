"""The end of a search is planned before it spends anything (search/loop/plan.py): no confirmation round on a
config whose class is unchecked and whose check cannot then fit, a leading class checked before its rounds,
the fastest same-math config kept as a candidate, and one line per class that cannot be checked.

The measurements, checks and the clock are fakes: each round's measurement and each check advances a fake
clock by its seconds, so what the budget pays for is decided by construction, never by this machine's speed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.core.outcomes import Verdict
from autotune.core.settings import SearchSettings
from autotune.search import budget as budget_module
from autotune.search.budget import Budget
from autotune.search.checks import classes
from autotune.search.loop import confirm, export_ceiling, finish, gate
from autotune.search.loop import plan as plan_module
from autotune.search.store import records
from autotune.search.store.records import TrialRecord, write
from autotune.search.store.results import choose, class_label, exported
from autotune.search.store.storage import open_storage
from autotune.apply.display import export_notes
from tests.search.store.test_results import TINY

# Every trial, and so every confirmation measurement, takes WALL_S from launch to result.
WALL_S = 5.0
# The baseline's step and start-up: a class's check (classes.cost_s) is estimated from them.
STEP_S, STARTUP_S = 2.0, 5.0
BATCH = ("global batch 8 -> 16", "lr 0.001 -> 0.00141 (sqrt rule)")  # changes the step: time to target
BF16 = ("precision fp32 -> bf16",)  # keeps the step: parity


class Clock:
    """time.monotonic for the modules that read the budget: moves only when a fake measurement or check runs."""

    def __init__(self) -> None:
        self.t = 10_000.0

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    for module in (budget_module, confirm, plan_module, export_ceiling):
        monkeypatch.setattr(module, "time", c)
    return c


def study_of(tmp_path: Path, rows: list[tuple[str, dict[str, Any], float, tuple[str, ...]]]) -> optuna.Study:
    """A study of these (role, knobs, samples/s, training math) trials, each WALL_S long; the baseline's step
    and start-up recorded, so a check's cost is estimated as in a real search."""
    study = optuna.create_study(storage=open_storage(str(tmp_path / "studies.db")), direction="maximize")
    for role, knobs, value, changes in rows:
        t = study.ask()
        metrics = {"samples_per_s": value, "step_time_p50": STEP_S, "startup_s": STARTUP_S}
        write(
            t,
            TrialRecord(
                role=role, config=TINY.replace(**knobs).knobs(), metrics=metrics, training_math=changes, wall_s=WALL_S
            ),
        )
        t.set_constraint("infeasible", 0.0)
        study.tell(t, value)
    return study


def the_settings(tmp_path: Path) -> SearchSettings:
    return SearchSettings(
        budget_s=600, studies_dir=str(tmp_path / "s"), base=TINY, confirm_rounds=3, confirm_top=2, parity_steps=30
    )


def budget_with(settings: SearchSettings, clock: Clock, left_s: float) -> Budget:
    """The budget of a run whose end is `left_s` seconds away on the fake clock."""
    return Budget.of(settings, started=clock.t - settings.budget_s + left_s)  # type: ignore[operator]


def fakes(monkeypatch: pytest.MonkeyPatch, clock: Clock, verdict: str = Verdict.PASS) -> list[str]:
    """Instant stand-ins for a round's measurement (`measure trial N`, WALL_S on the clock, figures by
    construction: the class x1.3, the same-math config x1.2) and a class's check (`check trial N`, its
    estimated seconds on the clock, `verdict`); returns what ran, in order."""
    ran: list[str] = []
    figures = {"trial 1": 13.0, "trial 2": 12.5, "trial 3": 12.0, "baseline": 10.0}

    def measure(c: confirm.Candidate, *_: object) -> float:
        ran.append(f"measure {c.label}")
        clock.t += WALL_S
        return figures[c.label]

    def run_check(study: optuna.Study, settings: SearchSettings, t: Any, cfg: Any, *_: object) -> Any:
        ran.append(f"check trial {t.number}")
        clock.t += classes.cost_s(study, settings, t, cfg)
        check = {"kind": "time to target", "verdict": verdict, "reason": "by construction", "trial": t.number}
        check["seconds"] = 1.0
        records.write_class_check(study, class_label(t) or "", check)  # type: ignore[arg-type]
        return check

    monkeypatch.setattr(confirm, "_measure", measure)
    monkeypatch.setattr(classes, "run_check", run_check)
    return ran


def leading_class(tmp_path: Path) -> optuna.Study:
    """Trials 1 and 2 lead in one class that changes the optimizer step; trial 3, the fastest config of the
    baseline's own training, is third: outside the top 2 that confirmation measures."""
    return study_of(
        tmp_path,
        [
            ("baseline", {}, 10.0, ()),
            ("search", {"batch_size": 16}, 13.0, BATCH),
            ("search", {"batch_size": 16, "num_workers": 1}, 12.5, BATCH),
            ("search", {"num_workers": 2}, 11.5, ()),
        ],
    )


def check_s(study: optuna.Study, settings: SearchSettings) -> float:
    t = study.trials[1]
    return classes.cost_s(study, settings, t, TrialRecord.of(t).config_for(settings.base))


def test_no_round_is_spent_on_a_class_whose_check_cannot_then_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """Seen on README's 10-minute search: 3 rounds of the leading class's trials 8 and 6, then "parity: the
    check of trial 6 (about 152 s) does not fit", once per trial of the class, and no change exported. The
    budget left pays for 3 rounds of the top 2 beside the baseline (45 s), not for the class's check: the
    rounds go to the same-math trial 3, which is exported, and the class is said once, before any round."""
    study, settings = leading_class(tmp_path), the_settings(tmp_path)
    assert check_s(study, settings) > 150  # the reference's 2 runs and the candidate's, at 2 s a step
    ran = fakes(monkeypatch, clock)
    said: list[str] = []
    finish.confirm_and_gate(study, settings, budget_with(settings, clock, 50.0), say=said.append)
    assert not any(r in ran for r in ("measure trial 1", "measure trial 2", "check trial 1")), ran
    assert ran.count("measure trial 3") == 3 and exported(study).number == 3, (ran, said)
    lines = [line for line in said if BATCH[0] in line]
    assert len(lines) == 1, said  # one line for the class, not one per trial
    line = lines[0]
    assert line.startswith("time to target: ") and "trials 1, 2" in line, line  # the check's own name
    assert "not checked, so not exported" in line and "50 s left" in line
    assert said.index(line) < next(i for i, s in enumerate(said) if s.startswith("confirming:"))  # before rounds
    assert not any(s.startswith("parity: the check of trial") for s in said), said


def test_when_nothing_can_be_exported_it_is_said_before_any_round_and_the_budget_that_pays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """Only the unchecked class beats the baseline: no round is spent on it; that is said before the rounds,
    and the last line of the search's verdict names the budget that would pay for the class's check."""
    study = study_of(
        tmp_path,
        [
            ("baseline", {}, 10.0, ()),
            ("search", {"precision": "bf16"}, 13.0, BF16),
            ("search", {"precision": "bf16", "num_workers": 1}, 12.5, BF16),
        ],
    )
    settings = the_settings(tmp_path)
    ran = fakes(monkeypatch, clock)
    said: list[str] = []
    finish.confirm_and_gate(study, settings, budget_with(settings, clock, 50.0), say=said.append)
    assert ran == [], ran
    (line,) = [line for line in said if BF16[0] in line]
    assert line.startswith("parity: ") and "trials 1, 2" in line, said
    assert any(s.startswith("confirmation: no round runs") for s in said), said
    assert exported(study).number == 0
    need = check_s(study, settings) + 2 * 3 * WALL_S  # its check, then 3 rounds of it beside the baseline
    minutes = math.ceil((600 + need - 50) / 60)
    last = export_notes(study)[-1]
    assert "trial 1" in last and f"--budget {minutes}m" in last, export_notes(study)


@pytest.mark.parametrize("verdict", [Verdict.PASS, Verdict.FAIL])
def test_a_leading_class_is_checked_before_its_rounds_and_the_same_math_config_stays_a_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock, verdict: str
) -> None:
    """The budget pays for the class's check and its rounds: the check runs first, so a failed class gets no
    round; the fastest same-math config (trial 3, outside the top 2) is measured either way."""
    study, settings = leading_class(tmp_path), the_settings(tmp_path)
    ran = fakes(monkeypatch, clock, verdict)
    said: list[str] = []
    finish.confirm_and_gate(study, settings, budget_with(settings, clock, 300.0), say=said.append)
    assert ran[0] == "check trial 1" and ran.count("check trial 1") == 1, ran
    # a run of its own, and why its trial could not carry it: this study stored no reference
    (line,) = [line for line in said if "checked before its rounds" in line]
    assert "by a run of its own" in line and "stored no reference" in line, line
    assert ran.count("measure trial 3") == 3, ran
    if verdict == Verdict.PASS:
        assert ran.count("measure trial 1") == 3 and exported(study).number == 1
    else:
        assert "measure trial 1" not in ran and "measure trial 2" not in ran
        assert exported(study).number == 3


def test_the_gate_says_one_line_per_class_with_its_checks_own_name(tmp_path: Path, clock: Clock) -> None:
    """A class that does not fit is said once, with every config it holds, as "time to target" when it changes
    the optimizer step and "parity" when it keeps it; each of its trials records the same not-checked verdict."""
    study = study_of(
        tmp_path,
        [
            ("baseline", {}, 10.0, ()),
            ("search", {"batch_size": 16}, 14.0, BATCH),
            ("search", {"precision": "bf16"}, 13.5, BF16),
            ("search", {"batch_size": 16, "num_workers": 1}, 13.0, BATCH),
            ("search", {"batch_size": 16, "num_workers": 2}, 12.0, BATCH),
            ("search", {"precision": "bf16", "num_workers": 2}, 11.0, BF16),
        ],
    )
    settings = the_settings(tmp_path)
    said: list[str] = []
    checks = gate.run(study, settings, budget_with(settings, clock, 20.0), say=said.append)
    assert checks is not None and {k: v["verdict"] for k, v in checks.items()} == dict.fromkeys(
        ("1", "2", "3", "4", "5"), Verdict.NOT_CHECKED
    )
    unpaid = [s for s in said if "not checked, so not exported" in s]
    assert len(unpaid) == 2, said
    batch, bf16 = unpaid
    assert batch.startswith(f"time to target: {'; '.join(BATCH)} (trials 1, 3, 4)"), batch
    assert bf16.startswith(f"parity: {BF16[0]} (trials 2, 5)"), bf16
    assert choose(study).trial.number == 0


def test_a_config_measured_in_fewer_rounds_never_ranks_above_one_measured_in_more(tmp_path: Path) -> None:
    """Seen on a public script: "3 more round(s) of trial 7, trial 2, baseline", then "2 more round(s) of
    trial 7, baseline; trial 2 left out", and trial 2, measured in 1 round, ranked above trial 7, measured in
    3: "confirmation changed the order". One round is no ranking."""
    study = study_of(
        tmp_path,
        [
            ("baseline", {}, 10.0, ()),
            ("search", {"num_workers": 1}, 13.0, ()),
            ("search", {"num_workers": 2}, 12.0, ()),
        ],
    )
    pool = confirm.candidates(study, TINY, top=2)
    figures = [
        {"trial 1": 12.0, "trial 2": 15.0, "baseline": 10.0},
        {"baseline": 10.0, "trial 1": 12.0},
        {"trial 1": 12.0, "baseline": 10.0},
    ]
    summary = confirm.summarize(pool, *confirm.tally(figures), rounds=3)
    assert summary["confirmed_order"] == ["trial 1", "trial 2"] and summary["winner"] == 1
    assert not summary["order_changed"], summary


def test_a_not_checked_left_by_a_short_run_does_not_stand_against_its_class_verdict(
    tmp_path: Path, clock: Clock
) -> None:
    """A resumed study: the run before could not pay for trial 1's check and recorded it `not checked`; its
    class has passed since (checked first, or during the trials). The class's verdict stands for trial 1: a
    short budget once is no verdict, and trial 1 is exported."""
    study, settings = leading_class(tmp_path), the_settings(tmp_path)
    stale = {
        "1": {"verdict": Verdict.NOT_CHECKED, "reason": "the budget left was shorter than the check (about 196 s)"}
    }
    records.write_gate_checks(study, stale)  # type: ignore[arg-type]
    passed = {"kind": "time to target", "verdict": Verdict.PASS, "trial": 2, "reason": "x1.4 sooner"}
    records.write_class_check(study, class_label(study.trials[1]) or "", passed)  # type: ignore[arg-type]
    checks = gate.run(study, settings, budget_with(settings, clock, 300.0), say=lambda s: None)
    assert checks is not None and checks["1"]["verdict"] == Verdict.PASS
    assert exported(study).number == 1
