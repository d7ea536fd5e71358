"""scripts/gpu_check.sh without a GPU: its --dry-run plan names every step with its time limit and what it
asserts, runs nothing, and fits the 520 s guard by its own arithmetic; its result checker passes effects
the worker observed and fails a row whose config is merely echoed back; its trial driver runs rows through
the warm fork server by their deadlines (on the CPU, with the tiny test pipelines), skips a framework row
whose library is not installed, and runs the user's-path rows as planned (a script, a 2-rank script, a
2-rank script with no autotune line, a Lightning and a transformers job, FSDP2), whose results pass the checker once what only CUDA can show is
put in."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.trial.measurement.measure import MIG_NO_UTILISATION

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
GUARD_S = 520


def dry_run(tmp_path: Path) -> str:
    work = tmp_path / "work"
    env = {**os.environ, "GPU_CHECK_WORK": str(work)}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not work.exists()  # a plan only: nothing made, nothing run
    return done.stdout


def plan(tmp_path: Path) -> tuple[dict[str, tuple[int, str]], dict[str, tuple[int, str]], int]:
    """The dry run's steps and the trial rows under them, each (limit, what it asserts), and its total."""
    steps: dict[str, tuple[int, str]] = {}
    rows: dict[str, tuple[int, str]] = {}
    total = -1
    for line in dry_run(tmp_path).splitlines():
        m = re.match(r"^(  |    )(\S+)\s+(\d+)s  (.*)$", line)
        if not m:
            continue
        indent, name, limit, text = m.groups()
        if name == "total":
            total = int(limit)
        else:
            (steps if indent == "  " else rows)[name] = (int(limit), text)
    return steps, rows, total


# The user's paths: a script through the seams, the same script on 2 ranks, an unedited script on 2 ranks through
# the no-edit seams, a Lightning and a transformers job, FSDP2.
USERS_PATHS = ("script-bf16", "script-ddp2", "script-unedited2", "lightning-bf16", "hf-bf16-fused", "fsdp2")
ROWS = {
    "fp32-baseline",
    "pin-workers8",
    "fp16-channels-last",
    "bf16-fused-adamw",
    "forced-oom",
    "lm-cudagraphs",
    *USERS_PATHS,
}
# Left out for time, each to the CPU tests the script's header names.
DROPPED = ("compile-default", "ddp-accum", "parity-bf16")


def test_dry_run_prints_each_step_with_its_limit_and_the_limits_fit_the_guard(tmp_path: Path) -> None:
    steps, rows, total = plan(tmp_path)
    assert {"env-setup", "make-data", "trials", "assert-trials", "headroom", "search", "search-vs-pin"} <= set(steps)
    assert ROWS | {"server-start"} == set(rows)
    # The plan holds by arithmetic: the rows make the trials step, the steps the total, the total fits.
    assert steps["trials"][0] == sum(limit for limit, _ in rows.values())
    assert total == sum(limit for limit, _ in steps.values()) <= GUARD_S
    assert all(text.strip() for _, text in (*steps.values(), *rows.values()))  # each says what it asserts
    # Every step the GPU path runs is one of the plan's, on its clock: none runs outside the arithmetic.
    run = re.findall(r"^\s*(?:planned|assert_step|plan_limit) ([\w-]+)", SCRIPT.read_text(), flags=re.M)
    assert set(run) == set(steps), set(run) ^ set(steps)
    # A trial row's timeout is its whole limit: a fork needs seconds to start, a cold torchrun more.
    assert all(limit >= 15 for name, (limit, _) in rows.items() if name != "server-start")
    for name, words in {
        "fp32-baseline": "scaled no loss",
        "pin-workers8": "is_pinned()",
        "fp16-channels-last": "set, not observable",
        "lm-cudagraphs": "CUDA graphs 0 times",
        "bf16-fused-adamw": 'state["step"] on the GPU',
        "forced-oom": "status oom",
        "script-bf16": "at.model()",
        "script-ddp2": "process group of 2",
        "script-unedited2": "no autotune line and no process group",
        "lightning-bf16": "not a MISS, without lightning",
        "hf-bf16-fused": "not a MISS, without transformers",
        "fsdp2": "DTensor",
    }.items():
        assert words in rows[name][1], (name, rows[name][1])
    text = dry_run(tmp_path)
    assert "NVML lists the trial's pid" in text and "n/a under MIG" in text and "exit 1 on any MISS" in text
    # A row left out for time names the CPU tests that cover it, in the script's header.
    header = SCRIPT.read_text().split("set -uo pipefail")[0]
    assert all(f"#   - {name}" in header for name in DROPPED) and all(name in text for name in DROPPED)


def test_a_larger_search_budget_shows_in_the_plans_total(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_CHECK_WORK": str(tmp_path / "w"), "GPU_CHECK_SEARCH_BUDGET": "200s"}
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert re.search(r"^  search\s+245s", out.stdout, flags=re.M) and re.search(r"^  total\s+625s", out.stdout, re.M)


def test_a_budget_that_is_not_seconds_is_bad_input(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_CHECK_WORK": str(tmp_path / "w"), "GPU_CHECK_SEARCH_BUDGET": "2m"}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "GPU_CHECK_SEARCH_BUDGET" in done.stderr
    assert not (tmp_path / "w").exists()


# --- the result checker, fed results as the worker writes them ---------------------------------------


def heredoc(function: str) -> str:
    """The python program of one of the script's functions (the heredoc it runs)."""
    body = re.search(rf"^{function}\(\) \{{.*?<<'EOF'\n(.*?)\nEOF\n\}}", SCRIPT.read_text(), flags=re.S | re.M)
    assert body is not None, f"{function}() changed shape: update this test"
    return body.group(1)


def checker(tmp_path: Path) -> Path:
    path = tmp_path / "check.py"
    path.write_text(heredoc("check"))
    return path


PID = 4242


def result(observed: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A GPU trial's result with every COMMON observation in place (`extra` over the top level)."""
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
        "applied": {
            "observed": {"pid": PID, "nvml_pid": PID, "nvml_pids": [17, PID], "nvml_uuid": "GPU-58b2e1b9", **observed}
        },
        **extra,
    }


# What each row's running trial shows when its knobs took effect (the own loop's keys: observe.after_steps;
# the other kinds': observe.in_job and OutputDtype; FSDP2's: sharding.Probe, under applied.fsdp).
HONEST: dict[str, dict[str, Any]] = {
    "fp32-baseline": {"conv_output_dtype": "float32", "grad_scale": 1.0, "grad_scaler_scaled": False},
    "pin-workers8": {"batch_pinned": True, "child_processes": 8},
    "fp16-channels-last": {
        "conv_output_dtype": "float16",
        "conv_input_channels_last": True,
        "conv_output_channels_last": True,
        "grad_scale": 65536.0,
        "grad_scaler_scaled": True,
        "cudnn_benchmark": True,
        "tf32": True,
    },
    "lm-cudagraphs": {"compiled": True, "compiled_graphs": 2, "cudagraph_skips": 0},
    "bf16-fused-adamw": {"conv_output_dtype": "bfloat16", "optimizer_fused": True, "optimizer_step_device": "cuda:0"},
    "script-bf16": {
        "output_dtype": "bfloat16",
        "output_of": "the model at.model() got",
        "param_device": "cuda:0",
        "batch_pinned": True,
        "optimizer_fused": True,
        "optimizer_step_device": "cuda:0",
    },
    "script-ddp2": {
        "process_group_size": 2,
        "process_group_backend": "gloo",
        "param_device": "cuda:0",
        "global_batch": 16,
    },
    "script-unedited2": {
        "model_output_precision": "bf16",
        "model_weights_channels_last": True,
        "model_checkpointed_blocks": 2,
        "model_activation_bytes": {"held": 65536, "freed": 131072},
        "model_replicated": True,
        "sharded_loaders": 1,
        "process_group_size": 2,
        "process_group_backend": "gloo",
        "param_device": "cuda:0",
        "global_batch": 16,
    },
    "lightning-bf16": {"output_dtype": "bfloat16", "output_of": "net.0 (Linear)", "param_device": "cuda:0"},
    "hf-bf16-fused": {
        "output_dtype": "bfloat16",
        "output_of": "lm_head (Linear)",
        "param_device": "cuda:0",
        "optimizer_fused": True,
        "optimizer_step_device": "cuda:0",
    },
    "fsdp2": {"process_group_size": 2, "process_group_backend": "gloo"},
}
FSDP_SEEN = {  # sharding.Probe's record of FSDP2's first step on 2 ranks
    "dtensor_params": 30,
    "params": 30,
    "local_numel": 250_000,
    "numel": 500_000,
    "shard_device": "cuda",
    "block_output_dtype": "bfloat16",
    "sync_off_micro_steps": 6,
    "sync_on_micro_steps": 6,
}
EXTRA: dict[str, dict[str, Any]] = {
    "script-ddp2": {"world_size": 2},
    "script-unedited2": {"world_size": 2},
    "fsdp2": {"world_size": 2},
}


def honest(name: str) -> dict[str, Any]:
    r = result(HONEST[name], **EXTRA.get(name, {}))
    if name == "fsdp2":
        r["applied"]["fsdp"] = dict(FSDP_SEEN)
    return r


def run_check(
    tmp_path: Path, results: dict[str, dict[str, Any]], *names: str, rcs: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Each result is written as the row's result.json; a key "name/file" writes that file instead."""
    work = tmp_path / "work"
    for key, r in results.items():
        name, _, file = key.partition("/")
        target = work / "trials" / name / (file or "result.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(r))
        (work / "trials" / name / "rc").write_text((rcs or {}).get(name, "0"))
    env = {**os.environ, "GPU_CHECK_GPUS": "1"}
    return subprocess.run(
        [sys.executable, str(checker(tmp_path)), str(work), *names], capture_output=True, text=True, timeout=60, env=env
    )


def row_line(stdout: str, name: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith(name + " "))


def test_every_row_passes_on_what_the_trial_observed(tmp_path: Path) -> None:
    done = run_check(tmp_path, {name: honest(name) for name in HONEST}, *HONEST)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all("PASS" in row_line(done.stdout, name) for name in HONEST)
    # cudnn.benchmark has no observable effect: the row says so rather than assert the flag the worker set.
    assert "cudnn.benchmark: set, not observable" in row_line(done.stdout, "fp16-channels-last")
    assert (tmp_path / "work" / "assert_note").read_text() == f"{len(HONEST)} of {len(HONEST)} rows PASS"


def configs(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Each trial row's config, as the dry run prints it."""
    _, rows, _ = plan(tmp_path)
    out = {}
    for name, (_, text) in rows.items():
        m = re.match(r"config (\{.*?\}): ", text)
        if m:
            out[name] = json.loads(m.group(1))
    return out


def echoed(cfg: dict[str, Any]) -> dict[str, Any]:
    """A result that only repeats the config: every knob's applied record says it is in effect as asked,
    and every derived one too, but the trial observed nothing of the row's own effects."""
    full = TrialConfig(**{k: v for k, v in cfg.items() if k != "image_size"})
    applied: dict[str, Any] = {
        k: {"requested": getattr(full, k), "in_effect": getattr(full, k)} for k in full.to_dict() if k in cfg
    }
    applied["grad_accum"] = {"requested": full.grad_accum, "in_effect": full.grad_accum}
    applied["gpus"] = {"requested": full.gpus, "in_effect": full.gpus, "why": "2 processes over gloo (echoed)"}
    applied["optimizer_fusion"] = {"requested": full.optimizer_fusion, "in_effect": "torch.optim.AdamW(fused=True)"}
    applied["grad_scaler"] = full.precision == "fp16"
    applied["parallel"] = {"requested": full.parallel, "in_effect": full.parallel}
    r = result({}, world_size=full.gpus, warmup_s=40.0)
    r["applied"] = {**applied, "observed": r["applied"]["observed"]}  # the COMMON observations only
    return r


def test_no_row_passes_on_its_config_echoed_back(tmp_path: Path) -> None:
    """No assertion compares a value with the config that produced it: a trial that did nothing but
    report its config as in effect fails every row, each for an effect it did not observe."""
    rows = {name: cfg for name, cfg in configs(tmp_path).items() if name in HONEST}
    assert set(rows) == set(HONEST)  # every row the checker knows is planned, with its config
    done = run_check(tmp_path, {name: echoed(cfg) for name, cfg in rows.items()}, *rows)
    assert done.returncode == 1
    for name in rows:
        line = row_line(done.stdout, name)
        assert "MISS" in line and "observed " in line, line
    assert "in_effect" not in heredoc("check")  # rows read no applied record


@pytest.mark.parametrize(
    "name, observed, words",
    [
        ("fp16-channels-last", {"conv_input_channels_last": False}, "conv_input_channels_last"),  # NCHW after all
        ("fp16-channels-last", {"grad_scale": 1.0}, "grad_scale"),  # the GradScaler scaled nothing
        ("bf16-fused-adamw", {"conv_output_dtype": "float32"}, "conv_output_dtype"),  # autocast not in effect
        # Built fused=True, stepped by another kernel: the flag echoed, the fused kernel's effect not seen.
        ("bf16-fused-adamw", {"optimizer_step_device": "cpu"}, "optimizer_step_device"),
        ("fp32-baseline", {"grad_scaler_scaled": True}, "grad_scaler_scaled"),  # a loss went through a scaler
        ("fp16-channels-last", {"grad_scaler_scaled": False}, "grad_scaler_scaled"),
        ("pin-workers8", {"batch_pinned": False}, "batch_pinned"),
        ("pin-workers8", {"child_processes": 0}, "child_processes"),  # no live workers
        ("script-bf16", {"output_dtype": "float32"}, "output_dtype"),  # at.autocast() did not reach the model
        ("script-bf16", {"param_device": "cpu"}, "param_device"),  # the script's model stayed on the CPU
        ("script-bf16", {"batch_pinned": False}, "batch_pinned"),  # the seam did not reach its DataLoader
        ("script-bf16", {"optimizer_step_device": "cpu"}, "optimizer_step_device"),  # not the fused kernel
        ("script-ddp2", {"process_group_size": 1}, "process_group_size"),  # one process after all
        ("script-ddp2", {"global_batch": 8}, "global_batch"),  # one rank's batch counted
        ("script-ddp2", {"process_group_backend": "nccl"}, "process_group_backend"),  # not 2 ranks over gloo
        ("script-unedited2", {"model_replicated": False}, "model_replicated"),  # every rank trains its own model
        ("script-unedited2", {"sharded_loaders": 0}, "sharded_loaders"),  # every rank draws the same batches
        ("script-unedited2", {"model_output_precision": "fp32"}, "model_output_precision"),  # no autocast
        ("script-unedited2", {"model_checkpointed_blocks": 0}, "model_checkpointed_blocks"),  # none checkpointed
        ("script-unedited2", {"model_activation_bytes": {"held": 9, "freed": 0}}, "checkpointing freed"),
        ("script-unedited2", {"model_weights_channels_last": False}, "model_weights_channels_last"),
        ("lightning-bf16", {"output_dtype": "float32"}, "output_dtype"),  # the Trainer ran fp32
        ("lightning-bf16", {"param_device": "cpu"}, "param_device"),
        ("hf-bf16-fused", {"output_dtype": "float32"}, "output_dtype"),
        ("hf-bf16-fused", {"optimizer_step_device": "cpu"}, "optimizer_step_device"),
        ("fsdp2", {"process_group_size": 1}, "process_group_size"),
        ("fp32-baseline", {"nvml_pids": [17, 99]}, "not the trial's pid 4242"),  # NVML sampled another device
        ("fp32-baseline", {"nvml_pids": None, "nvml_pids_error": "NVMLError: Not Supported"}, "Not Supported"),
    ],
)
def test_an_effect_not_seen_is_a_miss(tmp_path: Path, name: str, observed: dict[str, Any], words: str) -> None:
    r = honest(name)
    r["applied"]["observed"].update(observed)
    done = run_check(tmp_path, {name: r}, name)
    assert done.returncode == 1 and words in row_line(done.stdout, name), done.stdout + done.stderr


@pytest.mark.parametrize(
    "fsdp, words",
    [
        ({"dtensor_params": 0}, "fsdp.dtensor_params"),  # nothing sharded
        ({"dtensor_params": 20}, "not every parameter a DTensor"),  # some blocks left whole
        ({"local_numel": 500_000}, "not each rank holds a part"),  # every rank holds all of it
        ({"shard_device": "cpu"}, "fsdp.shard_device"),  # the shards live on the host
        ({"block_output_dtype": "float32"}, "fsdp.block_output_dtype"),  # the bf16 parameters not in effect
        ({"sync_off_micro_steps": 0}, "fsdp.sync_off_micro_steps"),  # every micro-step reduced: no accumulation
    ],
)
def test_fsdp2_misses_a_probe_that_shows_no_sharding(tmp_path: Path, fsdp: dict[str, Any], words: str) -> None:
    r = honest("fsdp2")
    r["applied"]["fsdp"].update(fsdp)
    done = run_check(tmp_path, {"fsdp2": r}, "fsdp2")
    assert done.returncode == 1 and words in row_line(done.stdout, "fsdp2"), done.stdout + done.stderr


def test_a_framework_not_installed_is_skipped_not_missed(tmp_path: Path) -> None:
    work = tmp_path / "work" / "trials"
    (work / "lightning-bf16").mkdir(parents=True)
    (work / "lightning-bf16" / "rc").write_text("absent")
    (work / "lightning-bf16" / "failure").write_text("not installed: lightning (this python has no lightning)")
    done = run_check(tmp_path, {"fp32-baseline": honest("fp32-baseline")}, "fp32-baseline", "lightning-bf16")
    line = row_line(done.stdout, "lightning-bf16")
    assert done.returncode == 0 and "SKIP" in line and "not installed: lightning" in line, done.stdout
    note = (tmp_path / "work" / "assert_note").read_text()
    assert note == "1 of 2 rows PASS; not installed, skipped: lightning-bf16"


def test_utilisation_is_na_under_mig_and_never_required_there(tmp_path: Path) -> None:
    mig = {**honest("fp32-baseline"), "gpu_util": None, "gpu_util_error": MIG_NO_UTILISATION}
    done = run_check(tmp_path, {"fp32-baseline": mig}, "fp32-baseline")
    line = row_line(done.stdout, "fp32-baseline")
    assert done.returncode == 0 and "PASS" in line and "n/a under MIG" in line, done.stdout
    # Off MIG a missing utilisation is a miss, whatever NVML said.
    lost = {**honest("fp32-baseline"), "gpu_util": None, "gpu_util_error": "NVMLError: GPU is lost"}
    done = run_check(tmp_path, {"fp32-baseline": lost}, "fp32-baseline")
    assert done.returncode == 1 and "gpu_util is null" in done.stdout


def test_the_pid_looked_for_is_the_one_nvml_knows_and_a_hidden_one_is_said(tmp_path: Path) -> None:
    """In a container with its own pid namespace NVML lists host pids: the trial's host pid (nvml_pid) is the
    one looked for; where the container's /proc hides it, the row says so instead of missing."""
    container = honest("fp32-baseline")
    container["applied"]["observed"] |= {"pid": 7, "nvml_pid": PID}
    assert run_check(tmp_path, {"fp32-baseline": container}, "fp32-baseline").returncode == 0
    hidden = honest("fp32-baseline")
    why = "pid namespace: this process runs in its own pid namespace; NVML's pids are the host's"
    hidden["applied"]["observed"] |= {"pid": 7, "nvml_pid": None, "pid_namespace": why}
    done = run_check(tmp_path, {"fp32-baseline": hidden}, "fp32-baseline")
    line = row_line(done.stdout, "fp32-baseline")
    assert done.returncode == 0 and "PASS" in line and "NVML pid n/a: pid namespace" in line, done.stdout
    elsewhere = honest("fp32-baseline")
    elsewhere["applied"]["observed"] |= {"pid": 7, "nvml_pid": 8}  # known, and not among the device's
    done = run_check(tmp_path, {"fp32-baseline": elsewhere}, "fp32-baseline")
    assert done.returncode == 1 and "not the trial's pid 8" in done.stdout


def test_a_row_skipped_or_not_run_is_a_miss(tmp_path: Path) -> None:
    work = tmp_path / "work" / "trials"
    (work / "bf16-fused-adamw").mkdir(parents=True)
    (work / "bf16-fused-adamw" / "rc").write_text("skipped")
    (work / "bf16-fused-adamw" / "failure").write_text("skipped: time guard, the rows before it overran")
    done = run_check(tmp_path, {}, "bf16-fused-adamw", "script-bf16")
    assert done.returncode == 1
    assert "time guard" in row_line(done.stdout, "bf16-fused-adamw")
    assert "did not run" in row_line(done.stdout, "script-bf16")


def test_forced_oom_passes_on_exit_3_and_status_oom_only(tmp_path: Path) -> None:
    oom = {"status": "oom", "message": "CUDA out of memory. Tried to allocate 20.00 GiB"}
    assert run_check(tmp_path, {"forced-oom": oom}, "forced-oom", rcs={"forced-oom": "3"}).returncode == 0
    crashed = {"status": "error", "message": "RuntimeError: an illegal memory access"}
    done = run_check(tmp_path, {"forced-oom": crashed}, "forced-oom", rcs={"forced-oom": "1"})
    assert done.returncode == 1 and "expected exit 3" in done.stdout


# --- the headroom check, on a CUDA device faked for its one call ---------------------------------------


def run_headroom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peak: int, total: int, device_total: int
) -> tuple[int, str]:
    """The headroom program in this process, its one CUDA call answered for a device of device_total bytes."""
    import runpy
    import types

    r = {**honest("fp32-baseline"), "peak_memory_bytes": peak, "memory_total_bytes": total}
    (tmp_path / "result.json").write_text(json.dumps(r))
    (tmp_path / "headroom.py").write_text(heredoc("headroom"))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i=0: types.SimpleNamespace(total_memory=device_total)
    )
    monkeypatch.setattr(
        sys, "argv", [str(tmp_path / "headroom.py"), str(tmp_path / "result.json"), str(tmp_path / "note")]
    )
    with pytest.raises(SystemExit) as done:
        runpy.run_path(sys.argv[0], run_name="__main__")
    return int(done.value.code or 0), (tmp_path / "note").read_text()


H200 = 150_000_000_000  # 139.7 GiB


def test_headroom_holds_for_a_small_peak_on_a_large_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 at 256 px on an H200 leaves ~97% free: the shares asked come from that peak, so one above
    what it left is refused (a share capped at 89% never was) and one below passes."""
    code, note = run_headroom(tmp_path, monkeypatch, peak=int(0.03 * H200), total=H200, device_total=H200)
    assert code == 0, note
    assert note == "peak 4.19 GiB of 139.7 GiB, 97.00% free"


def test_headroom_misses_a_result_held_against_another_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, note = run_headroom(tmp_path, monkeypatch, peak=2**30, total=40 * 2**30, device_total=H200)
    assert code == 1 and "is not the device's" in note


# --- the trial driver, on the CPU with the tiny test pipelines -------------------------------------------


def driver(tmp_path: Path) -> Path:
    body = re.search(r"^planned trials .*?<<'EOF'\n(.*?)\nEOF\n", SCRIPT.read_text(), flags=re.S | re.M)
    assert body is not None, "the trials step changed shape: update this test"
    path = tmp_path / "driver.py"
    path.write_text(body.group(1))
    return path


@pytest.mark.slow
def test_the_driver_forks_each_row_by_its_deadline_and_records_its_exit(tmp_path: Path) -> None:
    work = tmp_path / "work"
    tiny, oom = '{"pipeline": "tests.fault_pipelines:tiny"}', '{"pipeline": "tests.fault_pipelines:oom"}'
    rows = [
        f"late|0|0|{tiny}|its deadline passed as the step began",
        "server-start|120|-|-|the server",
        f"tiny|60|0|{tiny}|a healthy trial",
        f"out-of-memory|60|3|{oom}|an OOM",
    ]
    env = {**os.environ, "STEP_LIMIT_S": "300", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(driver(tmp_path)), str(work), str(tmp_path / "data"), "0", *rows],
        capture_output=True,
        text=True,
        timeout=360,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the warm fork server is up" in done.stdout
    trials = work / "trials"
    assert (trials / "tiny" / "rc").read_text() == "0"
    r = json.loads((trials / "tiny" / "result.json").read_text())
    assert r["status"] == "ok" and r["applied"]["observed"]["child_processes"] == 0
    assert (trials / "out-of-memory" / "rc").read_text() == "3"
    assert json.loads((trials / "out-of-memory" / "result.json").read_text())["status"] == "oom"
    assert (trials / "late" / "rc").read_text() == "skipped"
    assert "time guard" in (trials / "late" / "failure").read_text()


def script_rows() -> dict[str, str]:
    """The ROWS the script hands its driver, by name, exactly as bash expands them."""
    block = re.search(r"^SCRIPT=.*?^\)$", SCRIPT.read_text(), flags=re.S | re.M)
    assert block is not None, "the ROWS block changed shape: update this test"
    done = subprocess.run(
        ["bash", "-c", block.group(0) + '\nprintf "%s\\n" "${ROWS[@]}"'], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return {line.split("|")[0]: line for line in done.stdout.splitlines()}


def run_driver(tmp_path: Path, rows: list[str], limit_s: float, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """The driver over `rows` in a fresh python (after `prelude`), each row given `limit_s` on this CPU."""
    rows = ["|".join([name, str(limit_s), *rest]) for name, _, *rest in (r.split("|") for r in rows)]
    env = {**os.environ, "STEP_LIMIT_S": str(limit_s * len(rows) + 30), "PYTHONPATH": str(REPO)}
    program = f"import runpy, sys\n{prelude}\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')"
    args = [str(tmp_path / "work"), str(tmp_path / "data"), "0", *rows]
    return subprocess.run(
        [sys.executable, "-c", program, str(driver(tmp_path)), *args],
        capture_output=True,
        text=True,
        timeout=limit_s * len(rows) + 120,
        env=env,
        cwd=REPO,
    )


def test_a_framework_row_without_its_library_is_skipped_at_once(tmp_path: Path) -> None:
    """A GPU machine's own python may lack lightning and transformers (no wheel is carried for them): their
    rows are marked absent, and never started."""
    rows = script_rows()
    prelude = "sys.modules['lightning'] = sys.modules['transformers'] = None  # as if not installed"
    done = run_driver(tmp_path, [rows["lightning-bf16"], rows["hf-bf16-fused"]], 60, prelude)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = tmp_path / "work" / "trials"
    for name, library in (("lightning-bf16", "lightning"), ("hf-bf16-fused", "transformers")):
        assert (trials / name / "rc").read_text() == "absent"
        assert f"not installed: {library}" in (trials / name / "failure").read_text()
        assert not (trials / name / "config.json").exists()  # no trial started


def on_gpu(r: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A result of this CPU with what only CUDA shows put in, as a GPU run writes it: the device and NVML's
    figures; the parameters and FSDP's shards on the GPU; AdamW's step count on it where the optimizer is
    fused (torch keeps it on the parameters' device then, on the CPU otherwise); a pinned batch where the
    config asks for pinning (a loader without CUDA has nothing to pin for). Every other observation is the
    CPU trial's own."""
    r = json.loads(json.dumps(r))
    r |= {"device": "NVIDIA H200", "gpu_util": 80.0}
    seen = r["applied"]["observed"]
    seen |= {"pid": PID, "nvml_pid": PID, "nvml_pids": [17, PID]}
    if seen.get("param_device") == "cpu":
        seen["param_device"] = "cuda:0"
    if seen.get("optimizer_step_device") == "cpu" and seen.get("optimizer_fused") is True:
        seen["optimizer_step_device"] = "cuda:0"
    if seen.get("batch_pinned") is False and config.get("pin_memory"):
        seen["batch_pinned"] = True
    if r["applied"].get("fsdp", {}).get("shard_device") == "cpu":
        r["applied"]["fsdp"]["shard_device"] = "cuda"
    return r


@pytest.mark.slow
def test_the_users_path_rows_run_as_planned_and_pass_on_what_they_observed(tmp_path: Path) -> None:
    """The script, 2-rank script, unedited 2-rank script, Lightning, transformers and FSDP2 rows, run by the
    driver on this CPU as the plan has them (2 ranks over gloo); each result, with what only CUDA shows put in
    (on_gpu), passes the checker: every key a row asserts is one its trial really writes, with the value the
    trial observed."""
    rows = script_rows()
    done = run_driver(tmp_path, [rows["server-start"], *(rows[name] for name in USERS_PATHS)], 240)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = tmp_path / "work" / "trials"
    configs = {name: json.loads(rows[name].split("|")[3]) for name in USERS_PATHS}
    results = {}
    for name in USERS_PATHS:
        log = (trials / name / "trial.log").read_text(errors="replace")[-3000:]
        assert (trials / name / "rc").read_text() == "0", f"{name}: {log}"
        results[name] = json.loads((trials / name / "result.json").read_text())
    assert all(results[name]["world_size"] == 2 for name in ("script-ddp2", "script-unedited2", "fsdp2"))
    gpu = tmp_path / "gpu"
    checked = run_check(gpu, {n: on_gpu(r, configs[n]) for n, r in results.items()}, *USERS_PATHS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert all("PASS" in row_line(checked.stdout, name) for name in USERS_PATHS)
    # As this CPU wrote them, each row misses: the device, and the GPU-only effects the checker asks for.
    cpu = run_check(tmp_path / "cpu", results, *USERS_PATHS)
    assert cpu.returncode == 1
    assert "observed param_device: 'cpu'" in row_line(cpu.stdout, "script-bf16")
    assert "observed param_device: 'cpu'" in row_line(cpu.stdout, "script-unedited2")  # the model it found
    assert "observed optimizer_step_device: 'cpu'" in row_line(cpu.stdout, "hf-bf16-fused")
    assert "observed fsdp.shard_device: 'cpu'" in row_line(cpu.stdout, "fsdp2")
