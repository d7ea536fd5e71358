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
from autotune.search.budget import Budget
from autotune.search.loop import confirm
from autotune.search.store.records import PARITY
from autotune.search.store.results import best_export, confirmed_figures, export_order, exported
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
    assert best["confirmed"]["verdict"] == "faster than the baseline in every round (x2.00..x2.22)"
    assert best["baseline"]["samples_per_s"] == 10.0
    # samples/s from the same rounds as the speedup; the search's one measurement beside it
    assert best["metrics"]["samples_per_s"] == 21.0 and best["metrics"]["search_samples_per_s"] == 20.0
    # The confirmed winner fails parity: the next in export order is exported, with its own rounds.
    study.set_user_attr(PARITY, {"2": {"verdict": "fail", "reason": "deviates"}, "1": {"verdict": "pass"}})
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["study"]["trial"] == 1 and best["parity"] == {"verdict": "pass"}
    assert best["confirmed"]["samples_per_s_median"] == 19.0 and best["speedup"] == pytest.approx(1.9)
    # A config that passed goes before one whose check did not fit in the budget; without any pass, the
    # unchecked one is exported (and says so in its parity section).
    study.set_user_attr(PARITY, {"2": {"verdict": "not checked"}, "1": {"verdict": "pass"}})
    assert exported(study).number == 1
    study.set_user_attr(PARITY, {"2": {"verdict": "not checked"}})
    assert exported(study).number == 2


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [2, 0])
def test_a_search_ends_confirmed_unless_turned_off(tmp_path: Path, rounds: int) -> None:
    settings = SearchSettings(
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
    assert summary["rounds"] == 2 and [r["label"] for r in summary["rows"]][-1] == "baseline"
    assert all(len(r["samples"]) == 2 for r in summary["rows"])  # every candidate measured in every round
    # Every round measured every config: each has one ratio to the baseline per round, the speedup their median.
    speedups = {r["trial"]: r["speedup_median"] for r in summary["rows"] if r["label"] != "baseline"}
    assert all(len(r["ratios"]) == 2 for r in summary["rows"])
    # The warm start's two loader workers halve a step's wait: the confirmed winner beats the baseline
    # beside it, and it is what is exported, with the rounds' median as its speedup.
    assert speedups[summary["winner"]] > 1.3, summary
    assert exported["confirmed"]["rounds"] == 2 and exported["study"]["trial"] == summary["winner"]
    assert exported["speedup"] == pytest.approx(speedups[summary["winner"]])
    assert any(s.startswith("confirmation:") for s in said)  # the reserve is announced up front
    logs = sorted((tmp_path / "studies" / "autotune" / "confirm").rglob("trial.log"))
    assert len(logs) == 2 * len(summary["rows"])  # each measurement a fresh trial process of its own


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
    # The gate failed the confirmed one and passed trial 2: the export is trial 2, so far unconfirmed.
    study.set_user_attr(PARITY, {"1": {"verdict": "fail", "reason": "deviates"}, "2": {"verdict": "pass"}})
    assert exported(study).number == 2 and confirmed_figures(study, 2) is None
    assert confirm.extension_s(study) > 0  # what the gate adds to the cost of checking it
    # No round fits: nothing changes, and it is said.
    spent = Budget.of(settings, started=time.monotonic() - 10_000)
    assert confirm.extend(study, settings, 2, spent, server=server, say=said.append) == first
    assert "confirmation: 0 of 1 round(s) fit in the budget" in said
    two = dataclasses.replace(settings, confirm_rounds=2)
    summary = confirm.extend(study, two, 2, server=server, say=said.append)
    rows = {r["label"]: r for r in summary["rows"]}
    assert len(rows["trial 2"]["samples"]) == 2 and len(rows["baseline"]["samples"]) == 1 + 2
    assert rows["trial 1"]["samples"] == first["rows"][0]["samples"]  # the earlier rounds are kept
    assert len(rows["trial 2"]["ratios"]) == 2  # paired with the baseline's figures of its own rounds
    speedup = statistics.median(rows["trial 2"]["ratios"])
    assert rows["trial 2"]["speedup_median"] == pytest.approx(speedup)
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert speedup > 1.3, rows  # two loader workers: about twice the baseline's samples/s, by construction
    assert best["study"]["trial"] == 2 and best["confirmed"]["rounds"] == 2
    assert best["speedup"] == pytest.approx(speedup)
    assert best["baseline"]["samples_per_s"] == pytest.approx(statistics.median(rows["baseline"]["samples"]))
    (extra,) = (tmp_path / "s" / "c" / "confirm").glob("*/trial-2")  # this run's own folder
    assert len(list(extra.rglob("trial.log"))) == 4  # each measurement a fresh process
    assert confirm.extend(study, two, 2, server=server, say=said.append) == summary  # confirmed once
