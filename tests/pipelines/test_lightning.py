"""`--pipeline lightning:MODULE:FACTORY`: a trial is Lightning's own Trainer.fit on the user's module and
datamodule, the knobs as Trainer arguments and a rebuilt train loader, measured by a Callback; a search
runs end to end on the docs' example, and its export is the Trainer's arguments, tuned."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.cli import main
from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.trial.loop import worker
from tests.pipelines.framework_helpers import (
    autotune,
    doc_commands,
    doc_example,
    no_trial_broke,
    ok,
    round_trips,
    with_short_budget,
)

pl = pytest.importorskip("lightning.pytorch")

SPEC = "lightning:tests.pipelines.lightning_jobs:make"


def trial(**knobs: Any) -> Any:
    """One trial in this process, as a forked trial runs it: the real Trainer.fit, the real callback (one
    compute thread: on a small shared machine two threads run a step many times slower)."""
    knobs = {"warmup_steps": 1, "timed_steps": 4, "window": 2, "num_threads": 1, **knobs}
    return worker.run(TrialConfig(pipeline=SPEC, **knobs))


def test_a_trial_is_trainer_fit_with_the_knobs(tmp_path: Path, repo_on_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    cfg = TrialConfig(
        pipeline=SPEC,
        batch_size=16,
        global_batch=32,
        num_workers=1,
        warmup_steps=2,
        timed_steps=6,
        window=2,
        num_threads=1,
    )
    result = worker.run(cfg, progress)
    a = result.applied
    assert a["batch_size"]["in_effect"] == 16 and a["num_workers"]["in_effect"] == 1  # the rebuilt loader's
    assert a["grad_accum"]["in_effect"] == 2  # the Trainer's accumulate_grad_batches
    assert a["precision"]["in_effect"] == "fp32" and a["precision"]["why"] == "Trainer(precision='32-true')"
    assert a["gpus"]["in_effect"] == 1 and a["lr"]["in_effect"] == [0.01]  # the datamodule's own batch: its own lr
    assert a["sampler"]["in_effect"] == "RandomSampler"
    assert a["framework"] == {
        "library": "lightning",
        "trainer_kwargs": {
            "accelerator": "cpu",
            "devices": 1,
            "strategy": "auto",
            "precision": "32-true",
            "accumulate_grad_batches": 2,
            "benchmark": False,
        },
        "dataloader_kwargs": {
            "batch_size": 16,
            "num_workers": 1,
            "pin_memory": False,
            "persistent_workers": False,
            "prefetch_factor": 2,
        },
        "num_threads": 1,  # not a Trainer argument: torch.set_num_threads, said in best.yaml
        "lr_scale": 1.0,
    }
    # Measured as the worker measures: warm-up untimed (and one more step draining the 1 worker x prefetch 2
    # batches made ahead, 2 a step), every step's loss, windows for pruning.
    assert result.timed_steps == 6 and len(result.losses) == 2 + 1 + 6 and all(map(math.isfinite, result.losses))
    assert len(result.windows) == 3 and len(progress.read_text().splitlines()) == 3
    assert result.samples_per_s > 0 and result.step_time_p50 > 0 and 0 <= result.data_wait_fraction < 1
    assert result.peak_memory_bytes > 0 and result.startup_s > 0
    # The module's own optimizer stepped: the toy task is learnt within a few steps.
    assert statistics.mean(result.losses[-3:]) < statistics.mean(result.losses[:3]), result.losses


def test_precision_and_the_scaled_lr_reach_the_trainer(repo_on_path: Path) -> None:
    result = trial(batch_size=8, precision="bf16", warmup_steps=0, timed_steps=2)
    a = result.applied
    assert a["precision"]["in_effect"] == "bf16" and a["precision"]["why"] == "Trainer(precision='bf16-mixed')"
    # The module's lr is meant for its datamodule's batch of 32: at global batch 8, x sqrt(8 / 32) in its
    # live optimizer, and the export says so.
    assert a["lr"]["requested"] == [0.01] and a["lr"]["in_effect"] == pytest.approx([0.005])
    assert "sqrt rule" in a["lr"]["why"] and a["framework"]["lr_scale"] == pytest.approx(0.5)


def test_losses_follow_the_seeds_as_parity_needs(repo_on_path: Path) -> None:
    """Parity compares trajectories from the same weights on the same data order: the same seeds give the
    same losses (loader workers change nothing), and another data seed another trajectory."""
    base = trial(warmup_steps=0, timed_steps=4).losses
    assert len(base) == 4
    assert trial(warmup_steps=0, timed_steps=4, num_workers=1).losses == base
    assert trial(warmup_steps=0, timed_steps=4, data_seed=1).losses != base


def test_a_knob_lightning_cannot_express_is_refused_with_why(repo_on_path: Path) -> None:
    with pytest.raises(TrialUnsupported, match=r"optimizer_fusion \(the LightningModule builds its own optimizer"):
        trial(optimizer_fusion="fused")


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--pipeline", "lightning:tests.pipelines.lightning_jobs:swapped"],
            "returned tuple (Toy, Classifier), expected (LightningModule, LightningDataModule[, trainer_kwargs])",
        ),
        (
            ["--pipeline", "lightning:tests.pipelines.lightning_jobs:module_only"],
            "returned Classifier, expected (LightningModule, LightningDataModule[, trainer_kwargs])",
        ),
        (
            ["--pipeline", SPEC, "--baseline", '{"channels_last": true}'],
            "--baseline sets channels_last, which --pipeline 'lightning:tests.pipelines.lightning_jobs:make' cannot express",
        ),
        (["--pipeline", "lightning:no_such_module_xyz:make"], "cannot import 'no_such_module_xyz'"),
        (
            ["--pipeline", "lightning:tests.pipelines.test_framework_baseline:bf16_true_trainer"],
            "Trainer(precision='bf16-true'): autotune measures 32-true, 16-mixed, bf16-mixed",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path,
    repo_on_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["search", "--budget", "1m", *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err and says in err, err
    assert not (tmp_path / "studies.db").exists()  # refused before any study was touched


def test_lightning_not_installed_is_bad_input(
    tmp_path: Path, repo_on_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)  # what an environment without it raises: ImportError
    code = main(["search", "--budget", "1m", "--pipeline", SPEC])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "needs lightning.pytorch, which cannot be imported" in err and "pip install 'autotune[frameworks]'" in err, (
        err
    )


@pytest.mark.slow
def test_docs_example_searches_exports_and_round_trips(tmp_path: Path) -> None:
    """The docs' Lightning example as written: its module, its search (with the suite's short budget),
    its export and its re-measurement."""
    (tmp_path / "my_lightning.py").write_text(doc_example("my_lightning.py"))
    search, export, again = doc_commands("my_lightning")
    run = autotune(*with_short_budget(search), cwd=tmp_path, pythonpath=tmp_path)  # parity: its own test below
    ok(run)
    # Knobs a Trainer cannot express are fixed, each with why.
    assert (
        "optimizer_fusion not searched: not supported by this pipeline: the LightningModule builds its own "
        "optimizer in configure_optimizers()"
    ) in run.stdout, run.stdout
    done = no_trial_broke(tmp_path / "studies.db", "lit")
    assert done[0].user_attrs["config"]["batch_size"] == 64  # --baseline: the job as the user runs it

    ok(autotune(*export, cwd=tmp_path, pythonpath=tmp_path))
    best = tmp_path / "studies" / "lit" / "best.yaml"
    exported = yaml.safe_load(best.read_text())
    assert exported["workload"]["pipeline"] == "lightning:my_lightning:make"
    assert exported["framework"]["trainer_kwargs"]["accumulate_grad_batches"] == 1
    # The export is ready to paste: the Trainer and the DataLoader take its arguments as they are.
    tuned: dict[str, Any] = {}
    exec((tmp_path / "tuned_lightning.py").read_text(), tuned)
    base = done[0].user_attrs["config"]
    # The user's --baseline won (trial 0, or a trial of the same knobs): the export keeps their own, changing nothing.
    if {k: exported["config"].get(k) for k in base} == base:
        assert tuned["trainer_kwargs"] == tuned["dataloader_kwargs"] == {}
        return
    assert tuned["trainer_kwargs"] == exported["framework"]["trainer_kwargs"]
    pl.Trainer(**tuned["trainer_kwargs"], logger=False)
    import torch

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.zeros(4, 1)), **tuned["dataloader_kwargs"]
    )
    assert loader.batch_size == exported["config"]["batch_size"]

    ok(autotune(*again, cwd=tmp_path, pythonpath=tmp_path))
    round_trips(best, tmp_path / "studies" / "lit" / "trial" / "result.json")


@pytest.mark.slow
def test_parity_checks_a_lightning_candidate(tmp_path: Path) -> None:
    """The search's parity check, unchanged, on Lightning trials: the baseline, its data-order twin and a
    candidate with a loader worker (the same training) each train 4 steps in a forked trial process."""
    from autotune.core.config import baseline_of
    from autotune.pipelines import preload_modules
    from autotune.search.checks import parity
    from autotune.trial.processes.warm_client import DEFAULT_PRELOAD
    from tests.conftest import warm_server_on_repo

    candidate = TrialConfig(pipeline=SPEC, num_workers=1)
    with warm_server_on_repo((*DEFAULT_PRELOAD, *preload_modules(SPEC))) as server:
        verdict = parity.check(candidate, baseline_of(candidate), 4, tmp_path, 120, server=server)
    assert verdict.runs == 3 and verdict.noise is not None and verdict.noise > 0  # the twin saw another order
    assert verdict.passed and verdict.deviation == 0.0, verdict
