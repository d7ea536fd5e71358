"""scripts/gpu_check.sh without a GPU: its --dry-run plan names every step and what it asserts, runs
nothing, and stays in step with the script; its result checker passes observed effects and fails a knob
that `applied` merely echoes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def dry_run(tmp_path: Path) -> str:
    work = tmp_path / "work"
    env = {**os.environ, "GPU_CHECK_WORK": str(work)}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not work.exists()  # a plan only: nothing made, nothing run
    return done.stdout


def test_dry_run_lists_every_trial_the_script_adds_and_what_it_asserts(tmp_path: Path) -> None:
    plan = dry_run(tmp_path)
    added = re.findall(r"^\s*add ([\w-]+) ", SCRIPT.read_text(), flags=re.M)
    assert {
        "fp32-baseline",
        "cudnn-channels-last",
        "ddp-gloo-2",
        "compile-default",
        "forced-oom",
        "global-batch-accum",
        "ddp-gloo-accum",
        "oom-rank1",
        "ddp-gloo-compile-ckpt",
        "pin-workers8-after",
        "baseline-after",
    } <= set(added)
    lines = {name: next((line for line in plan.splitlines() if re.search(rf"\b{name}\b", line)), "") for name in added}
    missing = [name for name, line in lines.items() if not line]
    assert not missing, f"steps the script runs but --dry-run does not list: {missing}"
    for name, words in {
        "fp16-gradscaler": "float16",
        "bf16": "bfloat16",
        "cudnn-channels-last": "channels_last",
        "compile-default": "warm-up",
        "ddp-gloo-2": "AUTOTUNE_DDP_BACKEND=gloo",
        "forced-oom": "status oom",
        "global-batch-accum": "grad_accum 4",
        "ddp-gloo-accum": "grad_accum 2",
        "oom-rank1": "oom_rank1_real",
        "ddp-gloo-compile-ckpt": "checkpoint_segments 5",
    }.items():
        assert words in lines[name], (name, lines[name])
    assert "NVML UUID == torch device UUID" in plan
    for step in (
        "env-setup",
        "make-data",
        "search",
        "exit 1 on any MISS",
        "parity-bf16",
        "train-compare-baseline",
        "comparison.time_to_target",
        "search-vs-pin",
        "0.9 x",
    ):
        assert step in plan
    # the steps the script runs outside `add` (parity, train, the search's side-by-side check) are planned too
    for name in re.findall(r'assert_step "assert ([\w-]+)"', SCRIPT.read_text()):
        if name not in ("trial", "compile", "search", "side-by-side", "ddp-compile-ckpt"):
            assert name in plan, name


# --- the result checker, fed results as the worker writes them ---------------------------------------


def checker(tmp_path: Path) -> Path:
    """The script's own check program (the heredoc in check()), as a file."""
    text = SCRIPT.read_text()
    body = re.search(r"^check\(\) \{.*?<<\'EOF\'\n(.*?)\nEOF\n\}", text, flags=re.S | re.M)
    assert body is not None, "check() changed shape: update this test"
    path = tmp_path / "check.py"
    path.write_text(body.group(1))
    return path


UUID = "58b2e1b9-aaaa-4b5c-8d9e-000000000000"


def result(observed: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "status": "ok",
        "device": "NVIDIA H200",
        "gpu_util": 80.0,
        "loss_first": 0.7,
        "loss_last": 0.6,
        "loss_finite": True,
        "samples_per_s": 100.0,
        "warmup_s": 2.0,
        "world_size": 1,
        "applied": {"observed": {"nvml_uuid": f"GPU-{UUID}", "torch_uuid": UUID, **observed}},
        **extra,
    }


def run_check(
    tmp_path: Path, results: dict[str, dict[str, Any]], *names: str, rcs: dict[str, int] | None = None
) -> subprocess.CompletedProcess[str]:
    """Each result is written as the trial's result.json; a key "name/file" writes that file instead."""
    work = tmp_path / "work"
    for key, r in results.items():
        name, _, file = key.partition("/")
        (work / "trials" / name).mkdir(parents=True, exist_ok=True)
        (work / "trials" / name / (file or "result.json")).write_text(json.dumps(r))
        (work / "trials" / name / "rc").write_text(str((rcs or {}).get(name, 0)))
    return subprocess.run(
        [sys.executable, str(checker(tmp_path)), str(work), *names], capture_output=True, text=True, timeout=60
    )


def test_observed_effects_pass(tmp_path: Path) -> None:
    done = run_check(
        tmp_path,
        {
            "fp32-baseline": result({"conv_output_dtype": "float32", "cudnn_benchmark": False}),
            "cudnn-channels-last": result(
                {
                    "conv_output_dtype": "float32",
                    "cudnn_benchmark": True,
                    "conv_input_channels_last": True,
                    "conv_output_channels_last": True,
                }
            ),
            "compile-default": result({"compiled": True, "compiled_graphs": 3}, warmup_s=33.0),
        },
        "fp32-baseline",
        "cudnn-channels-last",
        "compile-default",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASS") == 3


@pytest.mark.parametrize(
    "name, observed, extra, words",
    [
        # applied says channels_last, but the conv ran in NCHW: the knob did nothing
        (
            "cudnn-channels-last",
            {"cudnn_benchmark": True, "conv_input_channels_last": False, "conv_output_channels_last": False},
            {},
            "conv_input_channels_last",
        ),
        ("bf16", {"conv_output_dtype": "float32"}, {}, "conv_output_dtype"),  # autocast not in effect
        ("compile-default", {"compiled": True, "compiled_graphs": 1}, {"warmup_s": 2.5}, "no compile time"),
        (
            "fp32-baseline",
            {"conv_output_dtype": "float32", "cudnn_benchmark": False, "nvml_uuid": "GPU-other"},
            {},
            "NVML sampled GPU-other",
        ),
    ],
)
def test_an_effect_not_seen_is_a_miss(
    tmp_path: Path, name: str, observed: dict[str, Any], extra: dict[str, Any], words: str
) -> None:
    results = {name: result(observed, **extra)}
    if name == "compile-default":
        results["fp32-baseline"] = result({"conv_output_dtype": "float32", "cudnn_benchmark": False})
    done = run_check(tmp_path, results, name)
    assert done.returncode == 1 and "MISS" in done.stdout and words in done.stdout, done.stdout + done.stderr


# --- the rows added for --global-batch, DDP with accumulation, and a rank-1 OOM ---------------------------


def accum(grad_accum: int, gpus: int = 1, why: str = "") -> dict[str, Any]:
    applied = {
        "grad_accum": {"requested": grad_accum, "in_effect": grad_accum, "why": "global batch 32"},
        "batch_size": {"requested": 8, "in_effect": 8},
    }
    if gpus > 1:
        applied["gpus"] = {"requested": gpus, "in_effect": gpus, "why": why}
    r = result({"conv_output_dtype": "float32"}, world_size=gpus)
    r["applied"].update(applied)
    return r


def test_accumulation_rows_pass_on_the_grad_accum_in_effect(tmp_path: Path) -> None:
    done = run_check(
        tmp_path,
        {"global-batch-accum": accum(4), "ddp-gloo-accum": accum(2, gpus=2, why="2 processes over gloo on one GPU")},
        "global-batch-accum",
        "ddp-gloo-accum",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASS") == 2


@pytest.mark.parametrize(
    "name, r, words",
    [
        ("global-batch-accum", accum(1), "grad_accum in effect: 1"),  # --global-batch ignored: no accumulation
        ("ddp-gloo-accum", accum(4, gpus=2, why="over gloo"), "grad_accum in effect: 4"),  # world size not counted
        ("ddp-gloo-accum", {**accum(2, gpus=2, why="over gloo"), "world_size": 1}, "world_size 1"),
        ("ddp-gloo-accum", accum(2, gpus=2, why="over nccl"), "not gloo"),
    ],
)
def test_an_accumulation_not_in_effect_is_a_miss(tmp_path: Path, name: str, r: dict[str, Any], words: str) -> None:
    done = run_check(tmp_path, {name: r}, name)
    assert done.returncode == 1 and "MISS" in done.stdout and words in done.stdout, done.stdout + done.stderr


def test_rank1_oom_passes_on_rank_ones_own_verdict(tmp_path: Path) -> None:
    oom = {"status": "oom", "message": "CUDA out of memory. Tried to allocate 4096.00 GiB"}
    done = run_check(
        tmp_path,
        {"oom-rank1": {"status": "error", "message": "Connection closed by peer"}, "oom-rank1/result.json.rank1": oom},
        "oom-rank1",
        rcs={"oom-rank1": 3},
    )
    assert done.returncode == 0 and "PASS" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    "rank0, rank1, rc",
    [
        ({"status": "error"}, None, 3),  # no verdict from rank 1: the OOM is not shown to be rank 1's
        ({"status": "oom", "message": "CUDA out of memory"}, {"status": "error"}, 3),  # rank 0 ran out, not rank 1
        ({"status": "error"}, {"status": "oom"}, 1),  # the trial did not exit as out of memory
    ],
)
def test_rank1_oom_not_shown_is_a_miss(
    tmp_path: Path, rank0: dict[str, Any], rank1: dict[str, Any] | None, rc: int
) -> None:
    results = {"oom-rank1": rank0, **({"oom-rank1/result.json.rank1": rank1} if rank1 else {})}
    (tmp_path / "work" / "trials" / "oom-rank1").mkdir(parents=True)
    (tmp_path / "work" / "trials" / "oom-rank1" / "trial.log").write_text("line 1\nTraceback: the cause\n")
    done = run_check(tmp_path, results, "oom-rank1", rcs={"oom-rank1": rc})
    assert done.returncode == 1 and "MISS" in done.stdout and "expected exit 3" in done.stdout, done.stdout
    assert "Traceback: the cause" in done.stdout  # a failed row shows its trial log's tail
