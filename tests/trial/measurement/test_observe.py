"""autotune/trial/measurement/observe.py: what a trial records of what really happened, beside what `applied` says
was asked for: the loader's live workers and a batch's pinning, the optimizer's own defaults, the
GradScaler's scale, the micro-batches per step, the process group, and on CUDA the pids NVML lists on
the sampled device (a fake pynvml: this machine has no GPU)."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import psutil
import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.trial.loop import knobs
from autotune.trial.measurement import measure, observe
from autotune.trial.loop import worker as trial
from tests.fakes import UUID_A, UUID_B, FakeGpu, ProcNvml, fault_cfg

pytestmark = pytest.mark.usefixtures("repo_on_path")


@pytest.fixture
def inproc(monkeypatch: pytest.MonkeyPatch) -> None:
    """worker.run in this process, as a plain (not torchrun) process."""
    monkeypatch.delenv(trial.LAUNCH_TIME_ENV, raising=False)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def seen(**changes: Any) -> dict[str, Any]:
    r = trial.run(fault_cfg(warmup_steps=1, timed_steps=2, window=1, **changes))
    return r.applied["observed"]


def live_children() -> int:
    n = 0
    for c in psutil.Process().children():
        try:
            n += c.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            continue
    return n


def test_the_loaders_workers_are_seen_alive_while_it_iterates(inproc: None) -> None:
    before = live_children()  # whatever else this test process runs
    assert seen()["child_processes"] == before  # no workers: the items load in the trial's process
    assert seen(num_workers=2)["child_processes"] == before + 2


def test_a_pin_the_loader_did_not_make_is_seen_unpinned(inproc: None) -> None:
    """On the CPU the loader pins nothing: asked for, pin_memory is still not what the batches show."""
    got = seen(pin_memory=True)
    assert got["batch_pinned"] is False


def test_a_batch_is_pinned_when_its_tensors_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = torch.zeros(2, 3, 4, 4), torch.zeros(2, 1, 4, 4)
    assert observe._loader(iter([[(x, y)]]))["batch_pinned"] is False
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a, **k: True)  # what a pinned batch answers
    assert observe._loader(iter([[(x, y)]]))["batch_pinned"] is True
    # An exhausted loader costs the observation, not the trial.
    assert "batch_error" in observe._loader(iter([]))


@pytest.mark.parametrize(
    "fusion, fused, foreach",
    [("none", None, False), ("foreach", None, True), ("fused", True, None)],
)
def test_the_optimizers_own_defaults_are_recorded(inproc: None, fusion: str, fused: Any, foreach: Any) -> None:
    got = seen(optimizer_fusion=fusion)
    assert got["optimizer"] == "torch.optim.adamw.AdamW"
    assert got["optimizer_fused"] is fused and got["optimizer_foreach"] is foreach


def test_the_optimizer_is_read_not_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """An optimizer that dropped the flag (as a torch without a fused kernel for the device would) shows it."""
    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), fused=False)
    assert observe._optimizer(opt)["optimizer_fused"] is False


def test_the_grad_scalers_scale_is_recorded(inproc: None) -> None:
    assert seen()["grad_scale"] == 1.0  # fp32: GradScaler(enabled=False) scales nothing
    assert seen(precision="fp16")["grad_scale"] > 1.0  # the loss really was scaled


def test_micro_batches_per_step_are_counted_at_the_first_conv(inproc: None) -> None:
    assert seen()["conv_calls"] == 1
    assert seen(batch_size=2, global_batch=6)["conv_calls"] == 3  # 3 micro-batches accumulated per step


def test_a_plain_process_has_no_process_group(inproc: None) -> None:
    got = seen()
    assert got["process_group_size"] == 1 and got["process_group_backend"] is None


def test_the_process_group_is_read_from_torch_distributed() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        assert observe._process_group() == {"process_group_size": 1, "process_group_backend": "gloo"}
    finally:
        dist.destroy_process_group()


def test_a_cpu_trial_records_no_nvml_pids(inproc: None) -> None:
    got = seen()
    assert "pid" not in got and "nvml_pids" not in got


def test_on_cuda_this_pid_and_the_sampled_devices_pids_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial on its cuda:0, which is NVML's GPU 1: the pids are GPU 1's, where this process computes."""
    gpus = [FakeGpu(UUID_A), FakeGpu(UUID_B)]
    monkeypatch.setitem(sys.modules, "pynvml", ProcNvml(gpus, {id(gpus[0]): [11], id(gpus[1]): [os.getpid(), 12]}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    cfg = TrialConfig()
    h = types.SimpleNamespace(
        model=model,
        device=torch.device("cuda", 0),
        optimizer=torch.optim.AdamW(model.parameters()),
        precision=knobs.Precision(cfg, torch.device("cpu")),
    )
    util = measure.GpuUtilSampler(h.device)
    got = observe.after_steps(h, iter([[(torch.zeros(1), torch.zeros(1))]]), observe.FirstConv(model), util)
    assert got["pid"] == os.getpid() and got["nvml_pids"] == sorted([os.getpid(), 12])
    assert got["nvml_uuid"] == UUID_B and "nvml_pids_error" not in got


# --- what tells, where the flag or the constant would not (gpu_check's defect 6) -------------------------


def test_the_step_count_is_read_where_the_optimizer_keeps_it(inproc: None) -> None:
    """Fused Adam/AdamW keep state["step"] on the parameters' device, the others a CPU tensor: read from the
    tensor itself (here, a step count moved to the meta device shows as such), not from the fused flag."""
    assert seen(optimizer_fusion="fused")["optimizer_step_device"] == "cpu"  # the parameters' device, here
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    assert observe.optimizer_state(opt) == {"optimizer_step_device": None}  # no step yet
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert observe.optimizer_state(opt) == {"optimizer_step_device": "cpu"}
    for state in opt.state.values():
        state["step"] = state["step"].to("meta")  # as a fused kernel keeps it on its device
    assert observe.optimizer_state(opt) == {"optimizer_step_device": "meta"}
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sgd.step()
    assert observe.optimizer_state(sgd) == {"optimizer_step_device": None}  # SGD counts no steps


def test_the_fused_flag_is_the_param_groups_the_step_reads() -> None:
    """A script's seam sets fused on the optimizer's param groups before its first step: that is what runs."""
    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    opt.param_groups[0]["fused"] = True
    assert observe._optimizer(opt)["optimizer_fused"] is True


def test_a_disabled_scaler_scaled_nothing_and_an_enabled_one_did(inproc: None) -> None:
    """fp32's GradScaler(enabled=False) answers get_scale() 1.0 whatever ran; that it never scaled tells."""
    assert seen()["grad_scaler_scaled"] is False
    assert seen(precision="fp16")["grad_scaler_scaled"] is True
    idle = torch.amp.GradScaler("cpu", enabled=True)
    assert observe.scaled(idle) is False  # enabled, but no loss went through it


def test_the_output_dtype_is_what_the_watched_module_returned_under_autocast() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    layer, where = observe.first_layer(model)
    assert layer is model[0] and where == "0 (Linear)"
    watch = observe.OutputDtype(layer, where)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.ones(1, 4))
    assert watch.seen == {"output_dtype": "bfloat16", "output_of": "0 (Linear)"}
    model(torch.ones(1, 4))  # the hook removed itself after its first call: the record stays the first
    assert watch.seen["output_dtype"] == "bfloat16"
    whole = observe.OutputDtype(model, "the model")
    model(torch.ones(1, 4))
    assert whole.seen["output_dtype"] == "float32"
    assert observe.OutputDtype(None, "nothing").seen == {}


class Keyed(torch.nn.Module):
    """Returns a dict, as a transformers model's ModelOutput: the token ids first, then the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"ids": torch.zeros(1, dtype=torch.long), "logits": self.head(x)}


def test_the_output_dtype_of_a_dict_is_its_first_floating_point_tensors() -> None:
    model = Keyed()
    watch = observe.OutputDtype(model, "the model")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.ones(1, 2))
    assert watch.seen["output_dtype"] == "bfloat16"  # the logits, not the integer ids


def test_a_jobs_own_objects_are_read_through_their_wrappers() -> None:
    """in_job: the parameters' device and the optimizer inside accelerate's AcceleratedOptimizer."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    got = observe.in_job(model, types.SimpleNamespace(optimizer=opt), torch.device("cpu"), None)
    assert got["param_device"] == "cpu" and got["optimizer"] == "torch.optim.adamw.AdamW"
    assert got["optimizer_foreach"] is True and got["optimizer_step_device"] == "cpu"
    assert got["process_group_size"] == 1 and "pid" not in got  # a CPU job: no NVML
    assert observe.in_job(None, None, torch.device("cpu"), None)["param_device"] is None
