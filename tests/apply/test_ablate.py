"""autotune ablate: techniques from the study, the greedy order, and one real ablation end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.apply import ablate
from autotune.cli import build_parser
from autotune.core.config import BASELINE, TrialConfig
from autotune.core.errors import AutotuneError, TrialOOM
from autotune.search.store.storage import open_storage

FP = {
    "gpu_names": [],
    "gpu_count": 0,
    "cpu_model": "test",
    "cpu_cores": 2,
    "torch": "x",
    "cuda": None,
    "pipeline": "unet",
    "image_size": 64,
}


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_techniques_group_loader_knobs_with_num_workers() -> None:
    base = TrialConfig()
    best = base.replace(num_workers=2, persistent_workers=True, prefetch_factor=4, precision="bf16", batch_size=16)
    ts = ablate.techniques(base, best)
    assert ts == [
        {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4},
        {"batch_size": 16},
        {"precision": "bf16"},
    ]
    assert ablate.label(ts[0]) == "num_workers=2 (+persistent_workers=True, prefetch_factor=4)"
    # With workers already in the baseline, prefetch_factor alone is a technique of its own.
    base2 = base.replace(num_workers=2)
    assert ablate.techniques(base2, base2.replace(prefetch_factor=4)) == [{"prefetch_factor": 4}]
    assert ablate.techniques(base, base) == []


def test_techniques_group_fsdp_knobs_with_parallel() -> None:
    base = TrialConfig(gpus=2)
    best = base.replace(parallel="fsdp", fsdp_reduce_dtype="bf16", fsdp_reshard=False, batch_size=16)
    assert ablate.techniques(base, best) == [
        {"parallel": "fsdp", "fsdp_reshard": False, "fsdp_reduce_dtype": "bf16"},
        {"batch_size": 16},
    ]


def test_greedy_keeps_the_best_each_step_and_retries_failures() -> None:
    # Additive speeds, except batch_size=16 runs out of memory until checkpointing is on.
    gains = {"precision": 6.0, "checkpoint_segments": -1.0, "batch_size": 3.0}

    def measure(cfg: TrialConfig, name: str) -> float:
        if cfg.batch_size == 16 and cfg.checkpoint_segments == 0:
            raise TrialOOM("out of memory")
        return 10.0 + sum(g for k, g in gains.items() if getattr(cfg, k) != getattr(BASELINE, k))

    todo: list[dict[str, Any]] = [{"precision": "bf16"}, {"checkpoint_segments": 2}, {"batch_size": 16}]
    steps = ablate.greedy(TrialConfig(), todo, measure)
    assert [s["technique"] for s in steps] == ["baseline", "precision=bf16", "checkpoint_segments=2", "batch_size=16"]
    assert [s["samples_per_s"] for s in steps] == [10.0, 16.0, 15.0, 18.0]
    assert [round(s["gain"], 6) for s in steps] == [0.0, 6.0, -1.0, 3.0]
    assert steps[-1]["speedup"] == pytest.approx(1.8)
    assert steps[-1]["config"]["batch_size"] == 16 and steps[-1]["config"]["precision"] == "bf16"
    oom = [t for t in steps[1]["tried"] if t["technique"] == "batch_size=16"]
    assert oom and oom[0]["samples_per_s"] is None and oom[0]["reason"].startswith("oom")
    json.dumps(steps)  # stored as a study user attr: must be JSON-able


def test_greedy_stops_when_everything_left_fails() -> None:
    def measure(cfg: TrialConfig, name: str) -> float:
        if cfg.batch_size != 8:
            raise TrialOOM("out of memory")
        return 5.0

    steps = ablate.greedy(TrialConfig(), [{"batch_size": 64}], measure)
    assert len(steps) == 1 and steps[0]["unapplied"] == ["batch_size=64"]


def make_study(tmp_path: Path, data: Path, best_knobs: dict[str, Any]) -> str:
    """A journal study as `autotune search` leaves it: workload, fingerprint, a baseline and a best trial."""
    storage = str(tmp_path / "studies.db")
    study = optuna.create_study(study_name="abl", storage=open_storage(storage), direction="maximize")
    work = TrialConfig(data_dir=str(data), image_size=64, seconds=1, warmup_steps=1, window=1)
    study.set_user_attr("workload", work.workload())
    study.set_user_attr("fingerprint", FP)
    base = BASELINE.replace(batch_size=4)  # small steps: the test runs real trials
    for role, value, knobs in (("baseline", 2.0, base.knobs()), ("search", 3.0, base.replace(**best_knobs).knobs())):
        study.add_trial(
            optuna.trial.create_trial(
                value=value,
                user_attrs={"role": role, "config": knobs, "peak_memory_bytes": 500 * 2**20},
                constraints={"infeasible": 0.0},
            )
        )
    return storage


def test_nothing_to_ablate_is_bad_input(tmp_path: Path) -> None:
    storage = make_study(tmp_path, tmp_path, {})
    args = parse(["ablate", "--study", "abl", "--storage", storage, "--studies-dir", str(tmp_path / "studies")])
    with pytest.raises(AutotuneError, match="nothing to ablate"):
        args.func(args)


@pytest.mark.slow
def test_ablate_end_to_end(tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = make_study(
        tmp_path, tiny_data, {"precision": "bf16", "num_workers": 2, "persistent_workers": True, "prefetch_factor": 2}
    )
    studies = tmp_path / "studies"
    args = parse(["ablate", "--study", "abl", "--storage", storage, "--studies-dir", str(studies), "--seconds", "0.5"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    print(out)

    steps = optuna.load_study(study_name="abl", storage=open_storage(storage)).user_attrs["ablation"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0]["technique"] == "baseline" and steps[0]["speedup"] == 1.0
    assert {s["technique"] for s in steps[1:]} == {
        "precision=bf16",
        "num_workers=2 (+persistent_workers=True, prefetch_factor=2)",
    }
    assert len(steps[1]["tried"]) == 2 and len(steps[2]["tried"]) == 1  # greedy: both measured, then the rest
    for s in steps:
        assert s["samples_per_s"] > 0
        assert s["speedup"] == pytest.approx(s["samples_per_s"] / steps[0]["samples_per_s"])
    assert steps[-1]["config"]["precision"] == "bf16" and steps[-1]["config"]["num_workers"] == 2
    assert "ablation of study abl" in out and "precision=bf16" in out and "speedup" in out
    png = studies / "abl" / "ablation.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trial_dirs = sorted(p.name for p in (studies / "abl" / "ablation").iterdir())
    assert len(trial_dirs) == 4 and all(
        (studies / "abl" / "ablation" / d / "result.json").is_file() for d in trial_dirs
    )
