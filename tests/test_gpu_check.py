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
    assert {"fp32-baseline", "cudnn-channels-last", "ddp-gloo-2", "compile-default", "forced-oom"} <= set(added)
    lines = {name: next((line for line in plan.splitlines() if re.search(rf"\b{name}\b", line)), "") for name in added}
    missing = [name for name, line in lines.items() if not line]
    assert not missing, f"steps the script runs but --dry-run does not list: {missing}"
    for name, words in {"fp16-gradscaler": "float16", "bf16": "bfloat16", "cudnn-channels-last": "channels_last",
                        "compile-default": "warm-up", "ddp-gloo-2": "AUTOTUNE_DDP_BACKEND=gloo",
                        "forced-oom": "status oom"}.items():
        assert words in lines[name], (name, lines[name])
    assert "NVML UUID == torch device UUID" in plan
    for step in ("env-setup", "make-data", "search", "exit 1 on any MISS"):
        assert step in plan


# --- the result checker, fed results as the worker writes them ---------------------------------------

def checker(tmp_path: Path) -> Path:
    """The script's own check program (the heredoc in check()), as a file."""
    text = SCRIPT.read_text()
    body = re.search(r'^check\(\) \{.*?<<\'EOF\'\n(.*?)\nEOF\n\}', text, flags=re.S | re.M)
    assert body is not None, "check() changed shape: update this test"
    path = tmp_path / "check.py"
    path.write_text(body.group(1))
    return path


UUID = "58b2e1b9-aaaa-4b5c-8d9e-000000000000"


def result(observed: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"status": "ok", "device": "NVIDIA H200", "gpu_util": 80.0, "loss_first": 0.7, "loss_last": 0.6,
            "loss_finite": True, "samples_per_s": 100.0, "warmup_s": 2.0, "world_size": 1,
            "applied": {"observed": {"nvml_uuid": f"GPU-{UUID}", "torch_uuid": UUID, **observed}}, **extra}


def run_check(tmp_path: Path, results: dict[str, dict[str, Any]], *names: str) -> subprocess.CompletedProcess[str]:
    work = tmp_path / "work"
    for name, r in results.items():
        (work / "trials" / name).mkdir(parents=True, exist_ok=True)
        (work / "trials" / name / "result.json").write_text(json.dumps(r))
        (work / "trials" / name / "rc").write_text("0")
    return subprocess.run([sys.executable, str(checker(tmp_path)), str(work), *names], capture_output=True, text=True,
                          timeout=60)


def test_observed_effects_pass(tmp_path: Path) -> None:
    done = run_check(tmp_path, {
        "fp32-baseline": result({"conv_output_dtype": "float32", "cudnn_benchmark": False}),
        "cudnn-channels-last": result({"conv_output_dtype": "float32", "cudnn_benchmark": True,
                                       "conv_input_channels_last": True, "conv_output_channels_last": True}),
        "compile-default": result({"compiled": True, "compiled_graphs": 3}, warmup_s=33.0),
    }, "fp32-baseline", "cudnn-channels-last", "compile-default")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASS") == 3


@pytest.mark.parametrize("name, observed, extra, words", [
    # applied says channels_last, but the conv ran in NCHW: the knob did nothing
    ("cudnn-channels-last", {"cudnn_benchmark": True, "conv_input_channels_last": False,
                             "conv_output_channels_last": False}, {}, "conv_input_channels_last"),
    ("bf16", {"conv_output_dtype": "float32"}, {}, "conv_output_dtype"),  # autocast not in effect
    ("compile-default", {"compiled": True, "compiled_graphs": 1}, {"warmup_s": 2.5}, "no compile time"),
    ("fp32-baseline", {"conv_output_dtype": "float32", "cudnn_benchmark": False, "nvml_uuid": "GPU-other"}, {},
     "NVML sampled GPU-other"),
])
def test_an_effect_not_seen_is_a_miss(tmp_path: Path, name: str, observed: dict[str, Any], extra: dict[str, Any],
                                      words: str) -> None:
    results = {name: result(observed, **extra)}
    if name == "compile-default":
        results["fp32-baseline"] = result({"conv_output_dtype": "float32", "cudnn_benchmark": False})
    done = run_check(tmp_path, results, name)
    assert done.returncode == 1 and "MISS" in done.stdout and words in done.stdout, done.stdout + done.stderr
