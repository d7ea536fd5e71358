"""What a script trial records is what ran: the batch a script keeps (its DataLoader's), read from its
source and checked against what its loaders delivered at run time, the unit its throughput is counted in,
and whether the run seeded torch and followed the data seed (what parity can compare)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.knobs import tf32
from autotune.pipelines import base_config, load_pipeline, own_baseline, script
from autotune.search.checks import parity
from autotune.trial.loop import worker

SCRIPTS = Path(__file__).parent / "scripts"
KEEPS_16 = SCRIPTS / "keeps_16.py"


def study_base(path: Path, args: list[str], **extra: Any) -> TrialConfig:
    """The study's workload as `autotune search --script` makes it (the session's own_baseline)."""
    base = base_config(script.spec_of(str(path), args), None, None, "studies", **extra)
    own = own_baseline(load_pipeline(base), base.global_batch)
    base = base.replace(num_threads=1, warmup_steps=1, timed_steps=3, window=1)
    return base.replace(baseline=tuple(own.items())) if own else base


def test_a_script_that_keeps_batch_16_records_16(tmp_path: Path, server: Any) -> None:
    base = study_base(KEEPS_16, [])
    baseline = baseline_of(base)
    assert baseline.batch_size == 16 and baseline.global_batch_size == 16
    a = worker.run(baseline).applied
    assert a["batch_size"]["requested"] == 16 and a["batch_size"]["in_effect"] == 16
    assert a["global_batch"]["in_effect"] == 16 and a["script"]["samples_per_step"] == 16
    ref = parity.noise_reference(baseline, 4, tmp_path / "reference", 120, server)
    assert ref.samples == 4 * 16


def test_the_script_s_own_batch_and_accumulation_are_read_at_run_time() -> None:
    """Trial 0 reads what its loaders delivered per optimizer step: a batch the source reads as 16 runs 16
    x 2 micro-batches; one the source cannot read (a computed value) is still recorded as it ran."""
    a = worker.run(baseline_of(study_base(KEEPS_16, ["--accum", "2"]))).applied
    assert a["script"]["own"] == {
        "batch_size": 16,
        "accumulation": 2,
        "from": "its loaders: 32 sample(s) in 2 batch(es) per optimizer step",
    }
    assert a["global_batch"]["in_effect"] == 32 and a["script"]["batches_per_step"] == 2
    assert a["throughput"]["unit"] == "samples/s"
    assert a["script"]["seeded"] and a["script"]["data_order"].startswith("a DataLoader that shuffles")


def test_a_script_with_no_loader_is_measured_in_the_samples_its_model_was_fed() -> None:
    """No DataLoader and no at.batch_size(): the samples are what its model was fed (8 a call) x the backward
    passes of a step (its 2 micro-batches); the data seed reaches nothing (no at.data_seed(), no loader)."""
    no_loader = Path(__file__).parents[3] / "pipelines" / "scripts" / "no_loader.py"
    a = worker.run(baseline_of(study_base(no_loader, ["--steps", "50"]))).applied
    assert a["throughput"]["unit"] == "samples/s" and "its model was fed" in a["throughput"]["why"]
    assert a["script"]["samples_per_step"] == 16 and a["batch_size"]["in_effect"] == 8
    assert a["script"]["data_order"] is None and a["script"]["seeded"]


KEYWORDS = """import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(40):
    loss = torch.nn.functional.linear(input=torch.randn(5, 4), weight=model.weight).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_a_script_that_shows_no_batch_is_measured_in_steps_per_second(tmp_path: Path) -> None:
    """No loader, no batch handed over, and no model called with a tensor: optimizer steps per second, said."""
    path = tmp_path / "train.py"
    path.write_text(KEYWORDS)
    a = worker.run(baseline_of(study_base(path, []))).applied
    assert a["throughput"]["unit"] == "steps/s" and "optimizer steps are counted" in a["throughput"]["why"]
    assert a["batch_size"]["in_effect"] is None and a["batch_size"]["why"].startswith("not seen")  # no placeholder


@pytest.mark.slow
@pytest.mark.parametrize("computed", [False, True], ids=["source", "run time"])
def test_a_search_on_a_script_that_keeps_batch_16_exports_16(tmp_path: Path, computed: bool) -> None:
    """best.yaml says the batch that ran, whether the source says it (argparse, through a variable) or only
    the run does (a computed value: trial 0's loaders delivered 16, and the study is rebased on it)."""
    import yaml

    from tests.pipelines.framework_helpers import autotune

    path = KEEPS_16
    if computed:
        path = tmp_path / "computed.py"
        path.write_text(KEEPS_16.read_text().replace("bs = args.batch_size", "bs = args.batch_size * 2 // 2"))
    search = autotune(
        "search", "--script", str(path), "--budget", "60s", "--n-trials", "3", "--trial-seconds", "1",
        "--warmup-steps", "1", "--confirm-rounds", "0", "--parity-steps", "6", "--seed", "0", cwd=tmp_path,
    )  # fmt: skip
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    best = yaml.safe_load((tmp_path / "studies" / "autotune" / "best.yaml").read_text())
    assert best["config"]["batch_size"] == 16 and best["training_math"]["global_batch"] == 16, best
    assert best["metrics"]["throughput_unit"].startswith("samples/s")
    if best.get("parity", {}).get("samples"):
        assert best["parity"]["samples"] == 6 * 16


ACCUMULATING = SCRIPTS / "configured" / "accumulating.py"
CONFIGURED_ARGS = ["--batch_size=6", "--gradient_accumulation_steps=2", "--learning_rate=0.005"]


def test_a_script_that_accumulates_on_its_own_records_its_accumulation_and_global_batch() -> None:
    """llama2.c's shape: the batch is handed over (at.batch_size() after a configurator), the accumulation is
    the script's own loop (no at.accumulation()): trial 0 counts it from its loaders, so the global batch it
    records is 6 x 2, and the lr its optimizer was built with is the configurator's."""
    a = worker.run(baseline_of(study_base(ACCUMULATING, CONFIGURED_ARGS))).applied
    own = a["script"]["own"]
    assert (own["batch_size"], own["accumulation"]) == (6, 2), own
    assert "its loaders' 2 batch(es) per optimizer step" in own["from"]
    assert a["global_batch"]["in_effect"] == 12 and a["lr"]["requested"] == 0.005


def test_an_lr_the_script_sets_before_each_step_gets_the_trial_s_factor() -> None:
    """The script sets its optimizer's lr itself every step (a warm-up, then constant), overwriting the lr the
    trial scaled at construction: each value it sets is scaled too, so a trial at twice the batch trains at
    the sqrt rule's lr, and the record says the script's schedule was scaled."""
    base = study_base(ACCUMULATING, CONFIGURED_ARGS).replace(baseline={"batch_size": 6}, own_accumulation=2)
    run = worker.run(base.replace(batch_size=12, timed_steps=6))
    optimizer = run.applied["script"]["optimizers_built"][0]
    assert optimizer["own_schedule"] and optimizer["factor"] == pytest.approx(2**0.5)
    assert "a schedule of its own): the trial scaled each value it set by 1.414" in run.applied["lr"]["why"]
    # Past the warm-up the script sets 0.005 before every step; the step ran at 0.005 x sqrt(2).
    assert run.applied["script"]["lr_last_step"] == [pytest.approx(0.005 * 2**0.5)]


def test_a_process_flag_is_recorded_as_the_script_left_it(tmp_path: Path) -> None:
    """The trial sets TF32's flags before the script runs; a script that sets one itself afterwards ran with
    its own, and the record says that, not the config (observed; in effect only on CUDA, as every kind of job
    records it: on this machine with the reason)."""
    unedited = SCRIPTS / "unedited" / "train.py"
    own = tmp_path / "own_flag.py"
    own.write_text(
        unedited.read_text().replace(
            "import torch\n", "import torch\n\ntorch.backends.cuda.matmul.allow_tf32 = False\n", 1
        )
    )
    for path, seen in ((unedited, True), (own, False)):
        cfg = TrialConfig(
            pipeline=script.spec_of(str(path), ["--steps", "12"]), tf32=True, warmup_steps=1, timed_steps=3, window=1
        )
        a = worker.run(cfg).applied
        cuda = torch.cuda.is_available()
        assert a["tf32"]["requested"] is True and a["tf32"]["in_effect"] is (seen and cuda)
        assert a["observed"]["tf32"] is seen
        assert cuda or a["tf32"]["why"] == tf32.NO_CUDA
