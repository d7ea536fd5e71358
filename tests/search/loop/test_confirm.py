"""Confirmation: the winner is chosen by the median of interleaved re-measurements, each a ratio to the
baseline measured beside it; the speedup exported is that median, with its range; a reordering is said."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.core.settings import SearchSettings
from autotune.core.configfile import to_yaml
from autotune.search.budget import CONFIRM_OVERHEAD_S, Budget, confirm_trial_s
from autotune.search.loop import confirm
from autotune.search.store.records import PARITY, ConfirmationSummary
from autotune.search.store.results import best_export, choose, confirmed_figures, export_order, exported
from autotune.search.loop.session import SearchSession
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer
from tests.conftest import warm_server_on_repo
from tests.search.store.test_results import TINY, study_with

# The confirmation's end-to-end tests measure configs whose speeds differ by construction: two loader
# workers make a step about twice as fast (tests/speed_pipelines.py), so what is exported is asserted
# on every run, not only when the noise of tiny trials favours it.
LOADER_BOUND = TINY.replace(pipeline="tests.speed_pipelines:loader_bound")


def test_candidates_are_distinct_top_configs_then_the_baseline(tmp_path: Path) -> None:
    study = study_with(
        tmp_path,
        [
            ("baseline", {}, 10.0),
            ("search", {"batch_size": 4}, 30.0),
            ("search", {"batch_size": 4}, 29.0),
            ("search", {"batch_size": 16}, 20.0),
            ("search", {"batch_size": 32}, 15.0),
        ],
    )
    pool = confirm.candidates(study, TINY, top=2)
    assert [c.label for c in pool] == ["trial 1", "trial 3", "baseline"]  # trial 2 repeats trial 1's config
    assert pool[0].config.batch_size == 4 and pool[-1].config.batch_size == TINY.batch_size


def test_summary_picks_by_median_and_says_when_the_order_changed(tmp_path: Path) -> None:
    study = study_with(
        tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 30.0), ("search", {"num_workers": 2}, 20.0)]
    )
    pool = confirm.candidates(study, TINY, top=2)
    # Same-step configs (their export needs no time to target). The search's best was one lucky measurement; side by side, trial 2 is faster in 2 of 3 rounds.
    figures = [
        {"trial 1": 19.0, "trial 2": 21.0, "baseline": 10.0},
        {"baseline": 9.0, "trial 2": 20.0, "trial 1": 31.0},
        {"trial 1": 18.0, "trial 2": 22.0, "baseline": 11.0},
    ]
    summary = confirm.summarize(pool, *confirm.tally(figures), rounds=3)
    assert summary["winner"] == 2 and summary["order_changed"]
    assert summary["confirmed_order"] == ["trial 2", "trial 1"] and summary["baseline_median"] == 10.0
    row = next(r for r in summary["rows"] if r["trial"] == 2)
    # Each round's ratio to the baseline measured beside it (2.1, 20/9, 2.0): their median, their range.
    assert row["speedup_median"] == pytest.approx(2.1) and row["speedup_range"] == pytest.approx([2.0, 20 / 9])
    study.set_user_attr("confirmation", summary)
    assert [t.number for t in export_order(study)] == [2, 1, 0] and exported(study).number == 2
    assert confirmed_figures(study, 2)["rounds"] == 3
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["study"]["trial"] == 2 and best["speedup"] == pytest.approx(2.1)
    assert best["confirmed"]["speedup_range"] == pytest.approx([2.0, 20 / 9]) and best["confirmed"]["order_changed"]
    assert (
        best["confirmed"]["verdict"]
        == "faster than the baseline: x2.10 (x2.00..x2.22, 75% sign-test interval, 3 rounds)"
    )
    assert best["confirmed"]["interval"] == pytest.approx([2.0, 20 / 9]) and best["confirmed"]["coverage"] == 0.75
    assert best["baseline"]["samples_per_s"] == 10.0
    # samples/s from the same rounds as the speedup; the search's one measurement beside it
    assert best["metrics"]["samples_per_s"] == 21.0 and best["metrics"]["search_samples_per_s"] == 20.0
    # The confirmed winner fails parity: the next in export order is exported, with its own rounds.
    study.set_user_attr(PARITY, {"2": {"verdict": "fail", "reason": "deviates"}, "1": {"verdict": "pass"}})
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["study"]["trial"] == 1 and best["parity"] == {"verdict": "pass"}
    assert best["confirmed"]["samples_per_s_median"] == 19.0 and best["speedup"] == pytest.approx(1.9)
    # Both keep the baseline's training math: neither needs a check, so another's pass does not put it first.
    study.set_user_attr(PARITY, {"2": {"verdict": "not checked"}, "1": {"verdict": "pass"}})
    assert exported(study).number == 2
    study.set_user_attr(PARITY, {"2": {"verdict": "not checked"}})
    assert exported(study).number == 2


def _instant(monkeypatch: pytest.MonkeyPatch, figures: dict[str, float]) -> list[str]:
    """Confirmation measurements that take no time and read `figures` by label; returns the labels measured."""
    measured: list[str] = []

    def measure(c: confirm.Candidate, *_: object) -> float:
        measured.append(c.label)
        return figures[c.label]

    monkeypatch.setattr(confirm, "_measure", measure)
    return measured


def _three_candidates_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trials_left: float
) -> tuple[optuna.Study, list[str], ConfirmationSummary | None, list[str]]:
    """Trials 1 and 2 and the baseline confirmed with the budget's end `trials_left` confirmation trials
    away (by the first guess of their seconds): the study, the labels measured, the summary, the lines."""
    study = study_with(
        tmp_path,
        [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 30.0), ("search", {"num_workers": 2}, 20.0)],
        math={0: (), 1: (), 2: ()},
    )
    measured = _instant(monkeypatch, {"trial 1": 13.0, "trial 2": 12.0, "baseline": 10.0})
    settings = SearchSettings(budget_s=600, studies_dir=str(tmp_path / "s"), base=TINY, confirm_rounds=3, confirm_top=2)
    guess = confirm_trial_s(settings)  # a measurement's seconds and a fresh process's start-up
    assert guess == (TINY.seconds or 15.0) + CONFIRM_OVERHEAD_S
    budget = Budget.of(settings, started=time.monotonic() - 600 + trials_left * guess)
    said: list[str] = []
    return study, measured, confirm.run(study, settings, budget, say=said.append), said


def test_a_short_budget_leaves_candidates_out_so_the_rest_get_three_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rounds the budget shrank to one or two decide nothing (core/paired.py): the lowest-ranked candidates
    are left out instead, and the ones kept get the 3 rounds a gain needs."""
    # 3 rounds of the three (9 trials) do not fit; 3 rounds of trial 1 and the baseline (6) do.
    study, measured, summary, said = _three_candidates_with(tmp_path, monkeypatch, 7.5)
    assert summary is not None and summary["rounds"] == 3 and "trial 2" not in measured
    assert any("trial 2 left out: fewer than 3 rounds cannot show a gain" in line for line in said)
    rows = {r["label"]: r for r in summary["rows"]}
    assert rows["trial 1"]["measurable"] and rows["trial 1"]["interval"] == pytest.approx([1.3, 1.3])
    assert rows["trial 2"]["samples"] == [] and not rows["trial 2"]["measurable"]
    assert exported(study).number == 1


def test_a_budget_short_of_three_rounds_even_for_the_top_config_says_so_not_that_it_pays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left out down to the top config and the baseline, the rounds may still not reach 3: the line says
    the budget pays for fewer, and no round runs (it said the budget paid for 3 rounds, and 2 ran)."""
    study, measured, summary, said = _three_candidates_with(tmp_path, monkeypatch, 4.5)
    assert (
        "confirmation: the budget left pays for fewer than 3 more round(s) of trial 1, baseline; trial 2 left out: "
        "fewer than 3 rounds cannot show a gain, so none run"
    ) in said
    # Two rounds would fit, and decide nothing: none runs, and nothing the search found is exported.
    assert measured == [] and summary is not None and summary["rounds"] == 0
    assert exported(study).number == 0


def test_asked_for_fewer_than_three_rounds_the_confirmation_runs_three(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 30.0)], math={0: (), 1: ()})
    measured = _instant(monkeypatch, {"trial 1": 13.0, "baseline": 10.0})
    settings = SearchSettings(
        budget_s=None, studies_dir=str(tmp_path / "s"), base=TINY, confirm_rounds=2, confirm_top=1
    )
    said: list[str] = []
    summary = confirm.run(study, settings, say=said.append)
    assert summary is not None and summary["rounds"] == 3 and measured.count("trial 1") == 3
    assert "confirmation: 3 rounds, not 2: fewer cannot show a gain" in said


def test_when_no_round_fits_the_search_still_exports_no_unconfirmed_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget the trials spent to the end left no time to confirm: the fastest single measurement is not
    a measured gain, so the export is the baseline, the faster config named beside it."""
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 30.0)], math={0: (), 1: ()})
    _instant(monkeypatch, {"trial 1": 13.0, "baseline": 10.0})
    settings = SearchSettings(budget_s=600, studies_dir=str(tmp_path / "s"), base=TINY, confirm_rounds=3, confirm_top=1)
    spent = Budget.of(settings, started=time.monotonic() - 10_000)
    summary = confirm.run(study, settings, spent, say=lambda s: None)
    assert summary is not None and summary["rounds"] == 0
    assert exported(study).number == 0
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["passed_over"][0]["trial"] == 1 and "not in the confirmation rounds" in best["passed_over"][0]["why"]


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [3, 0])
def test_a_search_ends_confirmed_unless_turned_off(tmp_path: Path, rounds: int) -> None:
    # The loader knobs only, precision fixed (the warm start takes bf16 where this CPU has it, in the space
    # or not): every config computes the baseline's training, so with --parity-steps 0 any may be exported.
    space = tmp_path / "space.yaml"
    space.write_text(
        "knobs:\n  precision: fp32\n  num_workers: {low: 0, high: 2}\n  prefetch_factor: [2, 4]\n  persistent_workers: [false, true]\n"
    )
    settings = SearchSettings(
        space=str(space),
        budget_s=600,
        n_trials=4,
        storage=str(tmp_path / "studies.db"),
        studies_dir=str(tmp_path / "studies"),
        base=LOADER_BOUND,
        confirm_rounds=rounds,
        confirm_top=2,
        parity_steps=0,
    )
    said: list[str] = []
    outcome = SearchSession.create(settings, warm=True, say=said.append).run()
    exported = yaml.safe_load(outcome.best_yaml.read_text())
    if rounds == 0:
        assert outcome.confirmation is None and "confirmed" not in exported
        return
    summary = outcome.confirmation
    assert summary["rounds"] == 3 and [r["label"] for r in summary["rows"]][-1] == "baseline"
    assert all(len(r["samples"]) == 3 for r in summary["rows"])  # every candidate measured in every round
    # Every round measured every config: each has one ratio to the baseline per round, the speedup their median.
    speedups = {r["trial"]: r["speedup_median"] for r in summary["rows"] if r["label"] != "baseline"}
    assert all(len(r["ratios"]) == 3 for r in summary["rows"])
    # The warm start's two loader workers halve a step's wait: the confirmed winner beats the baseline
    # beside it; the export is the fastest config the rounds show measurably faster (the sign test: every
    # round), with the rounds' median as its speedup.
    assert speedups[summary["winner"]] > 1.3, summary
    measurable = [r for r in summary["rows"] if r["measurable"]]
    assert measurable, summary
    chosen = max(measurable, key=lambda r: r["speedup_median"])["trial"]
    assert exported["confirmed"]["rounds"] == 3 and exported["study"]["trial"] == chosen, summary
    assert exported["speedup"] == pytest.approx(speedups[chosen])
    assert any(s.startswith("confirmation:") for s in said)  # the reserve is announced up front
    logs = sorted((tmp_path / "studies" / "autotune" / "confirm").rglob("trial.log"))
    assert len(logs) == 3 * len(summary["rows"])  # each measurement a fresh trial process of its own


@pytest.mark.slow
def test_a_config_exported_after_the_confirmed_ones_failed_parity_is_confirmed_too(tmp_path: Path) -> None:
    study = study_with(
        tmp_path,
        [("baseline", {}, 10.0), ("search", {"batch_size": 4}, 30.0), ("search", {"num_workers": 2}, 20.0)],
    )
    settings = SearchSettings(
        budget_s=600,
        studies_dir=str(tmp_path / "s"),
        base=LOADER_BOUND,
        confirm_rounds=1,
        confirm_top=1,
        parity_steps=0,
    )
    said: list[str] = []
    with warm_server_on_repo(DEFAULT_PRELOAD) as server:  # forked fresh processes: a cold start each is ~6 s
        _confirm_then_extend(study, settings, server, said, tmp_path)


def _confirm_then_extend(
    study: optuna.Study, settings: SearchSettings, server: WarmServer, said: list[str], tmp_path: Path
) -> None:
    first = confirm.run(study, settings, server=server, say=said.append)
    assert first is not None and [r["label"] for r in first["rows"]] == ["trial 1", "baseline"]
    assert first["rounds"] == 3  # --confirm-rounds 1 asked, but fewer than 3 rounds cannot show a gain
    # The gate failed the confirmed one and passed trial 2: the export would be trial 2, so far
    # unconfirmed, so not yet exported.
    study.set_user_attr(PARITY, {"1": {"verdict": "fail", "reason": "deviates"}, "2": {"verdict": "pass"}})
    assert choose(study, gain=False).trial.number == 2 and confirmed_figures(study, 2) is None
    assert exported(study).number == 0
    assert confirm.extension_s(study) > 0  # what the gate adds to the cost of checking it
    # Its 3 rounds do not fit: nothing changes, and it is said.
    spent = Budget.of(settings, started=time.monotonic() - 10_000)
    assert confirm.extend(study, settings, 2, spent, server=server, say=said.append) == first
    assert any(line.startswith("confirmation: 3 rounds of trial 2 beside the baseline") for line in said)
    summary = confirm.extend(study, settings, 2, server=server, say=said.append)
    rows = {r["label"]: r for r in summary["rows"]}
    assert len(rows["trial 2"]["samples"]) == 3 and len(rows["baseline"]["samples"]) == 3 + 3
    assert summary["rounds"] == 3 + 3  # every round run, its own and the ones before
    assert rows["trial 1"]["samples"] == first["rows"][0]["samples"]  # the earlier rounds are kept
    assert len(rows["trial 2"]["ratios"]) == 3  # paired with the baseline's figures of its own rounds
    speedup = statistics.median(rows["trial 2"]["ratios"])
    assert rows["trial 2"]["speedup_median"] == pytest.approx(speedup)
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert min(rows["trial 2"]["ratios"]) > 1.2, (
        rows
    )  # two loader workers: about twice the baseline's samples/s, by construction
    assert best["study"]["trial"] == 2 and best["confirmed"]["rounds"] == 3
    assert best["speedup"] == pytest.approx(speedup)
    assert best["baseline"]["samples_per_s"] == pytest.approx(statistics.median(rows["baseline"]["samples"]))
    (extra,) = (tmp_path / "s" / "c" / "confirm").glob("*/trial-2")  # this run's own folder
    assert len(list(extra.rglob("trial.log"))) == 6  # each measurement a fresh process
    assert confirm.extend(study, settings, 2, server=server, say=said.append) == summary  # confirmed once


def test_when_no_round_fits_the_fastest_same_math_config_is_confirmed_not_a_slower_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on a public script: "0 of 3 rounds fit" dropped trials 9, 8 and 7, and the extension then confirmed
    trial 11 (x1.06, set_to_none false), which the search had measured slower than trial 8 (x1.17) without
    that knob, saying the rounds' configs "may not be exported (failed its check or was not checked)": false
    for configs of the baseline's training math. A row the rounds never reached keeps its place."""
    same: dict[int, tuple[str, ...]] = {0: (), 1: (), 2: (), 3: ()}
    study = study_with(
        tmp_path,
        [
            ("baseline", {}, 10.0),
            ("search", {"num_workers": 1}, 11.7),
            ("search", {"num_workers": 2}, 11.0),
            ("search", {"num_workers": 1, "set_to_none": False}, 10.6),
        ],
        math=same,
    )
    settings = SearchSettings(budget_s=600, studies_dir=str(tmp_path / "s"), base=TINY, confirm_rounds=3, confirm_top=2)
    spent = Budget.of(settings, started=time.monotonic() - 10_000)
    _instant(monkeypatch, {"trial 1": 12.0, "trial 2": 11.0, "baseline": 10.0})
    summary = confirm.run(study, settings, spent, say=lambda s: None)
    assert summary is not None and summary["rounds"] == 0 and [r["trial"] for r in summary["rows"]] == [1, 2, 0]
    assert [t.number for t in export_order(study)][:3] == [1, 2, 3]  # the search's order: nothing was measured
    assert choose(study, gain=False).trial.number == 1
    said: list[str] = []
    extended = confirm.extend(study, settings, 1, None, say=said.append)
    assert any(
        "confirming the exported trial 1 too, beside the baseline: the confirmation's rounds did not fit it; its "
        "own may run into the budget's grace" in line
        for line in said
    )
    rows = {r["label"]: r for r in extended["rows"]}
    assert [r["label"] for r in extended["rows"]].count("trial 1") == 1 and len(rows["trial 1"]["ratios"]) == 3
    assert exported(study).number == 1


def test_rounds_that_fit_only_in_the_alone_rounds_share_take_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on a held-out script: "0 of 3 round(s) fit", and the share kept for the alone rounds was never
    spent (they measure only a confirmed change): half the budget bought nothing. Rounds that fit only with
    that share take it, and say so."""
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 30.0)], math={0: (), 1: ()})
    measured = _instant(monkeypatch, {"trial 1": 20.0, "baseline": 10.0})
    settings = SearchSettings(budget_s=600, studies_dir=str(tmp_path / "s"), base=TINY, confirm_rounds=3, confirm_top=1)
    need = 2 * 3 * confirm_trial_s(settings)  # 3 rounds of one config and the baseline, at the first guess
    budget = dataclasses.replace(Budget.of(settings, started=time.monotonic() - 600 + need + 30), alone_reserve_s=100.0)
    said: list[str] = []
    summary = confirm.run(study, settings, budget, say=said.append)
    assert summary is not None and summary["rounds"] == 3 and measured.count("trial 1") == 3, said
    assert any(line.startswith("confirmation: takes the alone rounds' share (100 s)") for line in said), said
    none = dataclasses.replace(budget, alone_reserve_s=0.0, started=budget.started - 100)  # no share to take
    assert confirm.deadline(none, confirm_trial_s(settings), said.append) == none.confirm_end
