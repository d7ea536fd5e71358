"""The GPU paths of a trial, on a machine without one: apex's FusedAdam (a fake with apex's own
signatures), out-of-memory errors as cuBLAS, cuDNN, NCCL and the pin-memory thread raise them (through
the real worker process, one DDP rank alone too), DDP ranks' thread count, the warm-up's time (where
torch.compile compiles) and a dataset smaller than a batch."""

from __future__ import annotations

import inspect
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.core import errors
from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.trial.loop import harness
from autotune.trial.loop.knobs import optimizer_fusion
from autotune.trial.processes import launcher
from autotune.trial.loop import worker as trial
from tests.conftest import wait_until_gone
from tests.fakes import fault_cfg
from tests.trial import cuda_fault_pipelines as faults

pytestmark = [pytest.mark.usefixtures("repo_on_path"), pytest.mark.side_by_side]

PIPELINES = "tests.trial.cuda_fault_pipelines"


def cfg(pipeline: str = "tests.fault_pipelines:tiny", **changes: Any) -> TrialConfig:
    module, _, factory = pipeline.partition(":")
    return fault_cfg(factory, module, **changes)


@pytest.fixture
def inproc(monkeypatch: pytest.MonkeyPatch) -> None:
    """worker.run in this process, as a plain (not torchrun) process."""
    monkeypatch.delenv(trial.LAUNCH_TIME_ENV, raising=False)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


# --- apex: a fake package with apex's signatures (tests/fakes.py) --------------------------------


def test_fake_apex_is_detected_and_only_with_its_kernels(fake_apex_python_only: Path) -> None:
    import importlib

    assert optimizer_fusion.apex_available() is False  # a Python-only build: no amp_C
    (fake_apex_python_only / "amp_C.py").write_text("")
    importlib.invalidate_caches()
    assert optimizer_fusion.apex_available() is True


@pytest.mark.parametrize("set_to_none", [True, False])
def test_apex_trains_through_the_harness(fake_apex: Path, monkeypatch: pytest.MonkeyPatch, set_to_none: bool) -> None:
    # The CUDA gate (this machine has none); raising=False: a knobs without the gate still gets here.
    monkeypatch.setattr(optimizer_fusion, "apex_runs_on", lambda device: True, raising=False)
    h = harness.build(cfg(optimizer_fusion="apex", set_to_none=set_to_none))
    stream = h.batches()
    before = [p.detach().clone() for p in h.model.parameters()]
    losses = [h.step(next(stream)) for _ in range(2)]  # zero_grad(set_to_none=...) would be a TypeError
    assert all(math.isfinite(v) for v in losses)
    assert all(not torch.equal(a, b) for a, b in zip(before, h.model.parameters()))
    opt = h.optimizer
    assert type(opt).__module__ == "apex.optimizers" and type(opt).__name__ == "FusedAdam"
    assert opt.set_grad_none is set_to_none and opt.adam_w_mode is True
    # The same training as torch's AdamW: its default weight decay, which apex's default (0) is not.
    adamw_default = inspect.signature(torch.optim.AdamW).parameters["weight_decay"].default
    assert opt.weight_decay == adamw_default == 0.01
    grads = [p.grad for p in h.model.parameters()]
    if set_to_none:
        assert opt.zero_grad_calls == 2 and all(g is None for g in grads)
    else:  # apex's own zero_grad() would set them to None anyway (torch's default): the request holds
        assert all(g is not None and not g.any() for g in grads)
    assert h.applied["optimizer_fusion"]["in_effect"].startswith("apex.FusedAdam(")
    assert h.applied["set_to_none"] == {"requested": set_to_none, "in_effect": set_to_none}


def test_torch_adamw_gets_the_same_weight_decay() -> None:
    opt, _ = optimizer_fusion.build_optimizer(torch.nn.Linear(2, 2).parameters(), TrialConfig())
    assert opt.defaults["weight_decay"] == optimizer_fusion.WEIGHT_DECAY == 0.01


def test_apex_without_cuda_is_unsupported(fake_apex: Path) -> None:
    with pytest.raises(errors.TrialUnsupported, match="apex needs a CUDA device"):
        harness.build(cfg(optimizer_fusion="apex"))


# --- out of memory, as each library says it -------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError(faults.CUBLAS),
        RuntimeError(faults.CUDNN8),
        RuntimeError(faults.CUDNN9),
        torch.distributed.DistBackendError(faults.NCCL),
        faults.pin_thread_error(),
    ],
    ids=["torch", "cublas", "cudnn8", "cudnn9", "nccl", "pin_thread"],
)
def test_out_of_memory_is_recognised(error: BaseException) -> None:
    assert harness.is_out_of_memory(error)
    assert "out of memory" in harness.oom_message(error).lower() or "ALLOC" in harness.oom_message(error)


@pytest.mark.parametrize(
    "error",
    [
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        RuntimeError(
            "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."
        ),
        RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, ...)`"),
        RuntimeError("out of memory"),  # not a library's words: no library says only this
        torch.distributed.DistBackendError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
        ),
        ValueError("CUDA error: out of memory"),  # no library raises that type
    ],
    ids=["illegal_access", "cudnn_not_supported", "cublas_execution", "bare_words", "dist_peer_gone", "not_runtime"],
)
def test_other_errors_are_not_out_of_memory(error: BaseException) -> None:
    assert not harness.is_out_of_memory(error)


def test_pin_thread_message_names_the_allocation() -> None:
    e = faults.pin_thread_error()
    assert str(e).startswith("Caught AcceleratorError in pin memory thread")  # what the trial log shows first
    assert harness.oom_message(e) == (
        "torch.AcceleratorError: CUDA error: out of memory (Caught AcceleratorError in pin memory thread for device 0.)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["cublas", "cudnn9", "nccl", "pin"])
def test_worker_classifies_library_oom_as_trial_oom(tmp_path: Path, kind: str) -> None:
    with pytest.raises(errors.TrialOOM) as info:
        launcher.run_trial(cfg(f"{PIPELINES}:{kind}"), tmp_path / "t", timeout_s=120)
    assert "ALLOC" in str(info.value) or "out of memory" in str(info.value)
    assert "Traceback" in info.value.log_tail  # the whole error stays in the log


@pytest.mark.slow
def test_worker_keeps_other_cuda_errors_a_crash(tmp_path: Path) -> None:
    with pytest.raises(errors.TrialCrashed, match="illegal memory access"):
        launcher.run_trial(cfg(f"{PIPELINES}:illegal"), tmp_path / "t", timeout_s=120)


@pytest.mark.slow
def test_oom_on_one_ddp_rank_ends_the_trial_promptly(tmp_path: Path) -> None:
    trial_dir = tmp_path / "t"
    t0 = time.monotonic()
    with pytest.raises(errors.TrialOOM, match="CUBLAS_STATUS_ALLOC_FAILED"):
        launcher.run_trial(cfg(f"{PIPELINES}:cublas_rank1", gpus=2), trial_dir, timeout_s=300)
    took = time.monotonic() - t0
    assert took < 60, f"the trial took {took:.0f} s: rank 0 waited for rank 1 in the all-reduce"
    left = wait_until_gone(str(trial_dir))
    assert not left, [(p.pid, p.info.get("cmdline")) for p in left]


# --- DDP ranks' threads, warm-up time: a real 2-rank trial over gloo ----------------------------------


@pytest.mark.slow
def test_ddp_ranks_share_the_cores_and_report_warmup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.core.cpus import usable_cpus

    cpus = usable_cpus()  # affinity and CPU quota, as each rank counts them
    # torchrun leaves an OMP_NUM_THREADS that is set alone (and sets 1 otherwise). One that differs from
    # the fair share makes the check below tell the two apart on any machine, a 2-core one too.
    monkeypatch.setenv("OMP_NUM_THREADS", str(cpus // 2 + 1))
    r = launcher.run_trial(cfg(gpus=2, timed_steps=2, window=1), tmp_path / "t", timeout_s=300)
    assert r.world_size == 2
    assert r.applied["num_threads"]["in_effect"] == max(1, cpus // 2)
    assert "2 ranks" in r.applied["num_threads"]["why"]
    assert r.warmup_s is not None and r.warmup_s > 0
    assert r.applied["sampler"]["in_effect"] == "EndlessShuffle(seed=0, rank 0 of 2)"


@pytest.mark.slow
def test_ddp_records_the_global_batch_loss_not_rank_0s(tmp_path: Path) -> None:
    r = launcher.run_trial(
        cfg("tests.fault_pipelines:shard_loss", gpus=2, batch_size=4, timed_steps=3, window=1),
        tmp_path / "t",
        timeout_s=300,
    )
    assert r.world_size == 2
    # Each step's global batch is the whole 8-sample epoch: its mean index is 3.5 whatever the shuffle.
    assert r.losses == pytest.approx([3.5] * 4)
    assert r.loss_first == pytest.approx(3.5) and r.loss_last == pytest.approx(3.5)


# --- warm-up time, apart from the timed steps -----------------------------------------------------


@pytest.mark.alone  # compares the timed window with the windows' own clocks: a neighbour's burst moves one
def test_warmup_is_timed_apart_and_kept_out_of_samples_per_s(inproc: None) -> None:
    c = cfg(f"{PIPELINES}:slow_warmup", warmup_steps=2, timed_steps=4, window=2)
    r = trial.run(c)
    assert r.warmup_s >= 2 * faults.SlowWarmup.WARMUP_SLEEP_S
    elapsed = r.timed_steps * c.batch_size / r.samples_per_s
    assert elapsed < r.warmup_s / 2  # the slow (compiling) steps are not in the timed window
    # samples/s is still timed steps' samples over the timed window, which the windows tile.
    window_s = sum(c.window * c.batch_size / w for w in r.windows)
    assert r.samples_per_s == pytest.approx(r.timed_steps * c.batch_size / window_s, rel=0.2)
    assert r.metrics()["warmup_s"] == r.warmup_s
    assert TrialResult.from_dict(r.to_dict()).warmup_s == r.warmup_s


# --- effects observed inside the worker (what scripts/gpu_check.sh asserts on a GPU) -----------------


@pytest.mark.parametrize(
    "changes, want",
    [
        ({}, {"conv_output_dtype": "float32", "conv_input_channels_last": False, "conv_output_channels_last": False}),
        ({"channels_last": True}, {"conv_input_channels_last": True, "conv_output_channels_last": True}),
        ({"precision": "bf16"}, {"conv_output_dtype": "bfloat16"}),  # a 16x16 conv: bf16's slow CPU path is cheap here
        ({"checkpoint_segments": 1}, {"conv_output_dtype": "float32"}),  # the recompute does not overwrite it
    ],
)
def test_worker_observes_what_the_first_conv_really_did(
    inproc: None, changes: dict[str, Any], want: dict[str, Any]
) -> None:
    r = trial.run(cfg(warmup_steps=1, timed_steps=1, window=1, **changes))
    seen = r.applied["observed"]
    assert {k: seen.get(k) for k in want} == want
    assert seen["cudnn_benchmark"] is False and seen["compiled"] is False and "nvml_uuid" not in seen  # CPU


def test_the_conv_hook_is_gone_after_the_first_step() -> None:
    from autotune.trial.measurement import observe

    model = faults.TinyPipeline(None).build_model()
    conv = observe.FirstConv(model)
    model(torch.randn(1, 3, 8, 8))
    conv.close()
    assert not model[0]._forward_hooks and conv.seen["conv_output_dtype"] == "float32"


def test_a_compiled_model_gets_no_hook_and_says_it_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.trial.measurement import observe

    model = faults.TinyPipeline(None).build_model()
    wrapped = torch.nn.Module()
    wrapped._orig_mod = model  # what torch.compile's OptimizedModule holds
    conv = observe.FirstConv(wrapped)
    assert not model[0]._forward_hooks and not conv.seen
    seen = observe.observed(wrapped, torch.device("cpu"), conv, None)
    assert seen["compiled"] is True


# --- a dataset smaller than one batch -------------------------------------------------------------


def test_a_batch_larger_than_the_dataset_runs_in_a_trial(inproc: None) -> None:
    r = trial.run(cfg(f"{PIPELINES}:few_items", batch_size=8, warmup_steps=1, timed_steps=3, window=1))
    assert r.status == "ok" and r.timed_steps == 3 and r.loss_finite  # 8-item batches from 6 items
    assert r.applied["sampler"]["in_effect"] == "EndlessShuffle(seed=0)"
