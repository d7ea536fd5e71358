"""A script study's last word: its export applied to a copy of the script and run alone against the
script as written, in paired rounds, each side a fresh process. Their figure is the speedup best.yaml
gives; when they cannot tell the two apart (here: the patched script is slower, built into the script),
the export is "no change" and the diff is empty. The speed differences are built in (a dataset that
sleeps per item in the process that loads it), never noise."""

from __future__ import annotations

import textwrap
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.apply.export.patched import patched_copy
from autotune.apply.export.diff import NO_CHANGE, to_diff
from autotune.core.config import TrialConfig
from autotune.core.configfile import to_yaml
from autotune.core.paired import MIN_ROUNDS
from autotune.core.settings import SearchSettings
from autotune.search.budget import Budget
from autotune.search.loop import alone
from autotune.search.store import last_word as store
from autotune.search.store.records import StudyRecord, TrialRecord, write, write_gate_checks
from autotune.search.store.results import best_export
from autotune.search.store.storage import open_storage

# Each item sleeps in the process that loads it: in the main process (`--sleep-in main`) two workers load
# twice as fast; in the workers (`--sleep-in workers`) they are slower than none at all.
SCRIPT = """
import argparse, time
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

p = argparse.ArgumentParser()
p.add_argument("--sleep-in", choices=("main", "workers", "nowhere"), default="main")
p.add_argument("--no-workers", action="store_true")  # a script that cannot load in worker processes
args = p.parse_args()


class Sleepy(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, i):
        in_worker = get_worker_info() is not None
        if in_worker and args.no_workers:
            raise RuntimeError("this dataset cannot be loaded in a worker process")
        if in_worker == (args.sleep_in == "workers"):
            time.sleep(0.03 if in_worker else 0.01)
        return torch.ones(3), torch.ones(1)


loader = DataLoader(Sleepy(), batch_size=4, num_workers=0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def script_study(tmp_path: Path, args: str, best: dict[str, int] | None = None) -> tuple[optuna.Study, SearchSettings]:
    """A study of SCRIPT whose search measured `best` (num_workers=2) faster than the baseline (trial 1
    over 0)."""
    script = tmp_path / "project" / "train.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(SCRIPT))
    base = TrialConfig(pipeline=f"script:{script} {args}", warmup_steps=2, seconds=5.0)
    study = optuna.create_study(
        study_name="s", storage=open_storage(str(tmp_path / "studies.db")), direction="maximize"
    )
    StudyRecord(workload=base.workload()).write(study)
    for role, knobs, value in (("baseline", {}, 100.0), ("search", best or {"num_workers": 2}, 200.0)):
        t = study.ask()
        metrics = {"samples_per_s": value, "step_time_p50": 2.0, "device": "cpu"}  # 2 s: the fewest steps
        write(t, TrialRecord(role=role, config=base.replace(**knobs).knobs(), metrics=metrics, speedup=value / 100))
        t.set_constraint("infeasible", 0.0)
        study.tell(t, value)
    return study, SearchSettings(budget_s=None, base=base, studies_dir=str(tmp_path / "studies"))


@pytest.fixture
def three_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alone, "MAX_ROUNDS", MIN_ROUNDS)  # the fewest that can show a gain: the test's time


def test_a_patched_script_faster_alone_gives_its_paired_figure_as_the_speedup(
    repo_on_path: Path, tmp_path: Path, three_rounds: None
) -> None:
    study, settings = script_study(tmp_path, "--sleep-in main")
    said: list[str] = []
    record = alone.run(study, settings, None, patched_copy, say=said.append)
    assert record is not None and record["trial"] == 1 and record["rounds"] == MIN_ROUNDS
    assert record["measurable"] and record["exported"] == "the patched script"
    assert record["unit"] == "samples/s" and record["steps"] == alone.MIN_STEPS
    assert record["warmup"] == 2 + 2 * 2  # the warm-up, then the drain of 2 workers x 2 batches made ahead
    assert all(r > 1 for r in record["ratios"]) and record["search_speedup"] == 2.0
    copy = Path(record["patched_copy"])
    assert "num_workers=2" in copy.read_text() and "num_workers=0" in Path(record["script"]).read_text()
    # Each side a fresh process, its log and figures kept; the script as written first in even rounds.
    runs = sorted(p.relative_to(copy.parent.parent).as_posix() for p in copy.parent.parent.glob("round-*/*.json"))
    assert runs == [f"round-{r}/{side}.json" for r in range(MIN_ROUNDS) for side in ("as_written", "patched")]
    assert any(line.startswith("alone round 3:") for line in said) and said[-1].startswith("alone: faster than")
    # best.yaml: the alone figure is the speedup, the search's figures beside it.
    exported = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert exported["config"]["num_workers"] == 2
    assert exported["speedup"] == pytest.approx(record["median"]) and exported["alone"]["search_speedup"] == 2.0
    assert exported["alone"]["verdict"].startswith("faster than the script as written")


def test_a_patched_script_not_faster_alone_is_exported_as_no_change(
    repo_on_path: Path, tmp_path: Path, three_rounds: None
) -> None:
    study, settings = script_study(tmp_path, "--sleep-in workers")
    record = alone.run(study, settings, None, patched_copy, say=lambda s: None)
    assert record is not None and not record["measurable"] and all(r < 1 for r in record["ratios"])
    assert record["exported"] == "no change: no measurable gain alone"
    export = best_export(study, None, None)
    assert export.config.num_workers == 0 and export.study["trial"] == 0  # the script as written
    # The config passed over is named with the figure that overruled it: what the user would get.
    assert export.passed_over and export.passed_over[0]["speedup"] == pytest.approx(record["median"])
    assert yaml.safe_load(to_yaml(export))["alone"]["verdict"].startswith("slower than the script as written")
    assert to_diff(export) == NO_CHANGE == ""  # nothing to apply: an empty diff, which patch -p0 accepts


def test_no_alone_rounds_where_the_budget_cannot_pay_or_nothing_changes(tmp_path: Path) -> None:
    study, settings = script_study(tmp_path, "--sleep-in main")
    spent = Budget.of(SearchSettings(budget_s=60.0, base=settings.base), started=0.0)  # long over
    record = alone.run(study, settings, spent, patched_copy, say=lambda s: None)
    assert record is not None and "cannot pay for 3 paired rounds" in record["skipped"]
    # The search's export stands, and says why the rounds did not run.
    export = best_export(study, None, None)
    assert export.study["trial"] == 1 and export.speedup == 2.0 and "cannot pay" in export.alone["skipped"]
    assert store.read(study) == record
    # No patcher handed in (a caller outside the CLI), or another kind of job: nothing to run.
    assert alone.run(study, settings, None, None) is None
    other = SearchSettings(budget_s=None, base=TrialConfig(), studies_dir=settings.studies_dir)
    assert alone.run(study, other, None, patched_copy) is None


def test_a_patched_script_that_fails_alone_is_never_a_gain(repo_on_path: Path, tmp_path: Path) -> None:
    """The diff's num_workers=2 breaks a script whose dataset cannot load in workers: the script as written
    runs, the patched copy fails, and the export is "no change", said with the script's own error."""
    study, settings = script_study(tmp_path, "--sleep-in nowhere --no-workers")
    record = alone.run(study, settings, None, patched_copy, say=lambda s: None)
    assert record is not None and record["measurable"] is False, record
    assert record["verdict"].startswith("the patched script failed alone") and "worker process" in record["verdict"]
    assert record["exported"] == "no change: the export applied does not run alone"
    export = best_export(study, None, None)
    assert export.study["trial"] == 0 and export.config.num_workers == 0
    assert export.passed_over and export.passed_over[0]["trial"] == 1  # the search's choice, named with why


def test_a_config_on_several_gpus_is_not_run_alone(tmp_path: Path) -> None:
    study, settings = script_study(tmp_path, "--sleep-in main", best={"num_workers": 2, "gpus": 2})
    # Two GPUs double the global batch: exported only once its time-to-target check passed.
    write_gate_checks(study, {"1": {"kind": "time to target", "verdict": "pass"}})
    record = alone.run(study, settings, None, patched_copy, say=lambda s: None)
    assert record is not None and "runs under torchrun" in record["skipped"]
    assert not (Path(settings.studies_dir) / "s").exists() or not list(Path(settings.studies_dir).rglob("*.json"))


def test_the_steps_are_planned_for_the_time_left() -> None:
    assert alone.plan_steps(0.03, 3, float("inf")) == 500  # ALONE_TIMED_S of 30 ms steps
    assert alone.plan_steps(0.0017, 3, float("inf")) == 8824  # 1.7 ms steps: ~15 s of them, not a 1.7 s cap
    assert alone.plan_steps(0.00001, 3, float("inf")) == alone.MAX_STEPS
    assert alone.plan_steps(10.0, 3, float("inf")) == alone.MIN_STEPS
    left = 2 * MIN_ROUNDS * (10.0 + 3.0) / alone.PLAN_SHARE  # 3 s a run past its start-up, planned on 90%
    assert alone.plan_steps(0.1, 3, left) == 26
    assert alone.plan_steps(0.1, 3, 2 * MIN_ROUNDS * 10.5 / alone.PLAN_SHARE) is None  # not even MIN_STEPS
    # The plan leaves room: MIN_ROUNDS rounds of it still fit once a moment has passed.
    steps = alone.plan_steps(0.1, 3, 120.0)
    assert steps is not None and MIN_ROUNDS * 2 * (10.0 + (3 + steps + 1) * 0.1) < 120.0 - 1.0
