"""autotune/knobs.py: each knob reaches the object it is meant to change, in-process and fast.

On CPU some knobs cannot have an effect (pin_memory, cudnn.benchmark, fp16 tensor cores); for those
the tests prove that the request got through and that `applied` says, with a reason, that it is
not in effect.
"""

from __future__ import annotations


import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune.core import cpus as cpus_module
from autotune.trial.loop import knobs
from autotune.trial.loop.knobs import checkpoint_segments, optimizer_fusion
from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError, TrialUnsupported
from autotune.pipelines.unet.pipeline import UnetPipeline

pytestmark = pytest.mark.side_by_side

CPU = torch.device("cpu")


def dataset(n: int = 16) -> TensorDataset:
    return TensorDataset(torch.randn(n, 3, 8, 8), torch.rand(n, 1, 8, 8))


def unet() -> nn.Module:
    import segmentation_models_pytorch as smp

    torch.manual_seed(0)
    return smp.Unet("resnet34", encoder_weights=None, classes=1)


# --- process-wide knobs ---------------------------------------------------------------------------


def test_num_threads_reaches_torch() -> None:
    applied = knobs.setup_process(TrialConfig(num_threads=1), CPU)
    assert torch.get_num_threads() == 1  # conftest restores the count after the test
    assert applied["num_threads"] == {"requested": 1, "in_effect": 1, "why": "torch.set_num_threads(1)"}


def test_num_threads_zero_keeps_torch_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)  # a plain process, not a torchrun rank
    before = torch.get_num_threads()
    applied = knobs.setup_process(TrialConfig(num_threads=0), CPU)
    assert torch.get_num_threads() == before
    assert applied["num_threads"]["in_effect"] == before and applied["num_threads"]["why"]


@pytest.fixture
def cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cgroup filesystem of the test's own, without a CPU quota until the test writes one."""
    monkeypatch.setattr(cpus_module, "CGROUP_ROOT", tmp_path)
    (tmp_path / "cpu").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "quota",
    [
        ("cpu.max", "800000 100000\n"),  # cgroup v2: 8 CPUs
        ("cpu/cpu.cfs_quota_us", "750000\n"),  # cgroup v1: 7.5 CPUs, rounded up
    ],
)
def test_num_threads_zero_shares_the_cpu_quota_not_the_host_among_ranks(
    monkeypatch: pytest.MonkeyPatch, cgroup: Path, quota: tuple[str, str]
) -> None:
    # Two ranks in an 8-CPU pod on a 64-core host: 4 threads each, not 32.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(knobs.os, "sched_getaffinity", lambda pid: set(range(64)))
    (cgroup / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (cgroup / quota[0]).write_text(quota[1])
    applied = knobs.setup_process(TrialConfig(num_threads=0), CPU)
    assert torch.get_num_threads() == 4 == applied["num_threads"]["in_effect"]
    assert "8 usable cores" in applied["num_threads"]["why"]


@pytest.mark.parametrize("text, want", [("max 100000", None), ("150000 100000", 2), ("50000 100000", 1)])
def test_cpu_quota_in_whole_cpus(cgroup: Path, text: str, want: int | None) -> None:
    (cgroup / "cpu.max").write_text(text)
    assert cpus_module.cpu_quota(cgroup) == want
    (cgroup / "cpu.max").unlink()
    assert cpus_module.cpu_quota(cgroup) is None  # neither v2 nor v1 files
    (cgroup / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    (cgroup / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cpus_module.cpu_quota(cgroup) is None  # v1 without a quota


@pytest.mark.usefixtures("cgroup")
@pytest.mark.parametrize("cpus, local_world, want", [(8, 2, 4), (8, 3, 2), (2, 2, 1), (2, 4, 1)])
def test_num_threads_zero_shares_the_cores_among_torchrun_ranks(
    monkeypatch: pytest.MonkeyPatch, cpus: int, local_world: int, want: int
) -> None:
    # What torchrun gives every rank: its own OMP_NUM_THREADS=1 and the world sizes.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("WORLD_SIZE", str(local_world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    monkeypatch.setattr(knobs.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    torch.set_num_threads(1)
    applied = knobs.setup_process(TrialConfig(num_threads=0), CPU)
    assert torch.get_num_threads() == want  # conftest restores the count after the test
    assert applied["num_threads"]["in_effect"] == want and f"{local_world} ranks" in applied["num_threads"]["why"]


def test_num_threads_set_explicitly_wins_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(knobs.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert knobs.setup_process(TrialConfig(num_threads=3), CPU)["num_threads"] == {
        "requested": 3,
        "in_effect": 3,
        "why": "torch.set_num_threads(3)",
    }
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("on", [True, False])
def test_cudnn_benchmark_reaches_torch_and_says_why_on_cpu(on: bool) -> None:
    torch.backends.cudnn.benchmark = not on
    applied = knobs.setup_process(TrialConfig(cudnn_benchmark=on), CPU)
    assert torch.backends.cudnn.benchmark is on  # conftest restores the flag after the test
    rec = applied["cudnn_benchmark"]
    assert rec["requested"] is on and rec["in_effect"] is False
    assert ("why" in rec) is on and (not on or "CUDA" in rec["why"])


def test_to_device_channels_last() -> None:
    x = torch.randn(2, 3, 8, 8)
    assert knobs.to_device(x, CPU, TrialConfig(channels_last=True)).is_contiguous(memory_format=torch.channels_last)
    assert knobs.to_device(x, CPU, TrialConfig()).is_contiguous()
    y = torch.randn(2, 5)  # not an image batch: left alone
    assert knobs.to_device(y, CPU, TrialConfig(channels_last=True)).shape == (2, 5)


# --- optimizer fusion -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fusion, key, value, other",
    [
        ("none", "foreach", False, ("fused", None)),
        ("foreach", "foreach", True, ("fused", None)),
        ("fused", "fused", True, ("foreach", None)),
    ],
)
def test_optimizer_fusion_reaches_adamw(fusion: str, key: str, value: bool, other: tuple[str, Any]) -> None:
    model = nn.Linear(4, 2)
    opt, applied = optimizer_fusion.build_optimizer(model.parameters(), TrialConfig(optimizer_fusion=fusion, lr=0.01))
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults[key] is value and opt.defaults[other[0]] is other[1]
    assert opt.defaults["lr"] == 0.01
    assert applied["optimizer_fusion"]["requested"] == fusion
    assert f"{key}={value}" in applied["optimizer_fusion"]["in_effect"]
    before = model.weight.detach().clone()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # the fused CPU kernel really runs
    assert not torch.equal(before, model.weight)


def test_optimizer_skips_frozen_parameters() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    opt, _ = optimizer_fusion.build_optimizer(model.parameters(), TrialConfig())
    assert sum(len(g["params"]) for g in opt.param_groups) == 2


def test_apex_without_apex_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optimizer_fusion, "apex_available", lambda: False)
    with pytest.raises(TrialUnsupported, match="apex.*not installed"):
        optimizer_fusion.build_optimizer(nn.Linear(2, 2).parameters(), TrialConfig(optimizer_fusion="apex"))


def test_apex_is_not_installed_here() -> None:
    assert optimizer_fusion.apex_available() is False  # so the subprocess tests see the same refusal


# --- precision ------------------------------------------------------------------------------------


def test_fp32_disables_autocast_and_scaler() -> None:
    p = knobs.Precision(TrialConfig(precision="fp32"), CPU)
    with p.autocast():
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32
    assert not p.scaler.is_enabled()
    assert p.applied["precision"] == {"requested": "fp32", "in_effect": "fp32"}
    assert p.applied["grad_scaler"] is False


def test_bf16_autocast_on_cpu() -> None:
    p = knobs.Precision(TrialConfig(precision="bf16"), CPU)
    lin = nn.Linear(4, 4)
    with p.autocast():
        assert lin(torch.randn(2, 4)).dtype == torch.bfloat16
    assert lin.weight.dtype == torch.float32  # autocast casts per op; the master weights stay fp32
    assert not p.scaler.is_enabled()  # bf16 has fp32's range: no loss scaling
    assert p.applied["precision"] == {
        "requested": "bf16",
        "in_effect": "bf16",
        "why": "autocast(cpu, bf16) around the forward and the loss",  # how, as every job kind says it
    }


def test_fp16_enables_grad_scaler_and_says_why_on_cpu() -> None:
    p = knobs.Precision(TrialConfig(precision="fp16"), CPU)
    assert p.scaler.is_enabled()
    assert p.applied["grad_scaler"] is True
    assert p.applied["precision"]["requested"] == "fp16" and "CUDA" in p.applied["precision"]["why"]
    lin = nn.Linear(4, 4)
    with p.autocast():
        out = lin(torch.randn(2, 4))
    assert out.dtype == torch.float16
    opt = torch.optim.AdamW(lin.parameters())
    p.scaler.scale(out.float().sum()).backward()
    p.scaler.step(opt)
    p.scaler.update()
    assert p.scaler.get_scale() > 0


# --- model knobs ----------------------------------------------------------------------------------


def conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))


def test_channels_last_reaches_conv_weights() -> None:
    model, applied = knobs.prepare_model(conv_net(), TrialConfig(channels_last=True), CPU, world=1)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model[2].weight.is_contiguous(memory_format=torch.channels_last)
    assert applied["channels_last"] == {"requested": True, "in_effect": True}
    plain, applied = knobs.prepare_model(conv_net(), TrialConfig(), CPU, world=1)
    assert not plain[2].weight.is_contiguous(memory_format=torch.channels_last)
    assert applied["channels_last"] == {"requested": False, "in_effect": False}


def test_single_process_is_not_wrapped_in_ddp() -> None:
    model, applied = knobs.prepare_model(conv_net(), TrialConfig(), CPU, world=1)
    assert not isinstance(model, nn.parallel.DistributedDataParallel)
    assert applied["gpus"] == {"requested": 1, "in_effect": 1}
    assert applied["compile"] == {"requested": "off", "in_effect": "off"}


@pytest.mark.slow
def test_compile_wraps_a_tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # Never the Unet (minutes on CPU); a Linear compiles in seconds and proves the knob gets through.
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "compile_threads", 1)  # no pool of compile workers left behind
    lin = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    want = lin(x)
    model, applied = knobs.prepare_model(lin, TrialConfig(compile="default"), CPU, world=1)
    assert isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
    assert applied["compile"] == {"requested": "default", "in_effect": "default"}
    torch.testing.assert_close(model(x), want)
    torch._dynamo.reset()


# --- activation checkpointing ---------------------------------------------------------------------


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("k", [0, 3, len(UnetPipeline.stages)])
def test_wrap_checkpoints_wraps_exactly_the_first_k_stages(k: int) -> None:
    model = unet()
    applied = checkpoint_segments.wrap_checkpoints(model, UnetPipeline.stages, k)
    wrapped = [isinstance(model.get_submodule(s), checkpoint_segments.CheckpointedStage) for s in UnetPipeline.stages]
    assert wrapped == [i < k for i in range(len(UnetPipeline.stages))]
    assert sum(isinstance(m, checkpoint_segments.CheckpointedStage) for m in model.modules()) == k
    assert applied["checkpoint_segments"] == {"requested": k, "in_effect": list(UnetPipeline.stages[:k])}


@pytest.mark.usefixtures("one_thread")
def test_checkpointed_unet_computes_the_same_output_and_gradients() -> None:
    plain = unet()
    ckpt = copy.deepcopy(plain)
    checkpoint_segments.wrap_checkpoints(ckpt, UnetPipeline.stages, 5)
    x = torch.randn(2, 3, 32, 32)  # the smallest size the Unet takes: this is about equality, not speed
    outs = []
    for model in (plain, ckpt):
        model.train()
        out = model(x)
        out.square().mean().backward()
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1])
    # The state_dict keys differ (".inner."), so compare gradients in module order.
    g_plain = [p.grad for p in plain.parameters()]
    g_ckpt = [p.grad for p in ckpt.parameters()]
    assert len(g_plain) == len(g_ckpt)
    for a, b in zip(g_plain, g_ckpt):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def bn_stages(momentum: float | None) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        *(
            nn.Sequential(nn.Conv2d(c, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=momentum), nn.ReLU())
            for c in (3, 4)
        ),
        nn.Conv2d(4, 1, 1),
    )


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("momentum", [0.1, None])  # None: a cumulative average, 1/num_batches_tracked
def test_checkpointed_batch_norm_updates_its_running_stats_once_per_step(momentum: float | None) -> None:
    plain = bn_stages(momentum)
    ckpt = copy.deepcopy(plain)
    checkpoint_segments.wrap_checkpoints(ckpt, ["0", "1"], 2)
    x = torch.randn(4, 3, 8, 8)
    for model in (plain, ckpt):
        model.train()
        for _ in range(2):  # two steps: the second's recompute would see the first's doubled update
            model(x).square().mean().backward()
    stats = [{k: v for k, v in m.state_dict().items() if "running" in k or "tracked" in k} for m in (plain, ckpt)]
    assert [k.replace(".inner", "") for k in stats[1]] == list(stats[0])
    for a, b in zip(stats[0].values(), stats[1].values()):
        torch.testing.assert_close(a, b)
    assert int(stats[1]["0.inner.1.num_batches_tracked"]) == 2
    grads = [[p.grad for p in m.parameters()] for m in (plain, ckpt)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_running_stats_kept_puts_the_same_buffers_back() -> None:
    bn = nn.BatchNorm1d(3).train()
    before = bn.running_mean
    with checkpoint_segments.running_stats_kept(bn):
        bn(torch.randn(5, 3))
    assert bn.running_mean is before and int(bn.num_batches_tracked) == 0
    assert torch.equal(before, torch.zeros(3))


def test_too_many_checkpoint_segments_is_unsupported() -> None:
    with pytest.raises(TrialUnsupported, match="declares 10 stages"):
        checkpoint_segments.wrap_checkpoints(unet(), UnetPipeline.stages, 11)


def saved_activation_bytes(k: int) -> int:
    """Bytes autograd keeps for backward during one Unet forward, with the first k stages checkpointed."""
    model = unet()
    checkpoint_segments.wrap_checkpoints(model, UnetPipeline.stages, k)
    model.train()
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # By storage, so a tensor saved by two ops counts once. Inside a checkpointed stage the
        # checkpoint's own hooks take over and save nothing, which is the point.
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(2, 3, 64, 64))
    return sum(storages.values())


@pytest.mark.usefixtures("one_thread")
def test_saved_activations_fall_as_checkpoint_segments_grow() -> None:
    saved = {k: saved_activation_bytes(k) for k in (0, 2, 5, 10)}
    assert saved[0] > saved[2] > saved[5] > saved[10] > 0, saved
    assert saved[10] < saved[0] / 10, saved  # all stages checkpointed: an order of magnitude less


# --- DDP on a machine with fewer GPUs than ranks: AUTOTUNE_DDP_BACKEND=gloo ------------------------


@pytest.mark.parametrize("value, want", [(None, "gloo"), ("gloo", "gloo"), ("GLOO ", "gloo")])
def test_ddp_backend_on_cpu(monkeypatch: pytest.MonkeyPatch, value: str | None, want: str) -> None:
    if value is None:
        monkeypatch.delenv(knobs.DDP_BACKEND_ENV, raising=False)
    else:
        monkeypatch.setenv(knobs.DDP_BACKEND_ENV, value)
    assert knobs.ddp_backend(CPU) == want


@pytest.mark.parametrize("value, words", [("mpi", "expected one of gloo, nccl"), ("nccl", "needs CUDA")])
def test_ddp_backend_refuses_what_cannot_run(monkeypatch: pytest.MonkeyPatch, value: str, words: str) -> None:
    monkeypatch.setenv(knobs.DDP_BACKEND_ENV, value)
    with pytest.raises(ConfigError, match=words):
        knobs.ddp_backend(CPU)


def one_gpu(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_gloo_ranks_share_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = one_gpu(monkeypatch)
    monkeypatch.setenv(knobs.DDP_BACKEND_ENV, "gloo")
    assert [knobs.pick_device(r) for r in (0, 1)] == [torch.device("cuda", 0)] * 2 and chosen == [0, 0]
    assert knobs.ddp_backend(torch.device("cuda", 0)) == "gloo"
    assert "over gloo" in knobs._ddp_why(2, torch.device("cuda", 0))


def test_without_gloo_each_rank_takes_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = one_gpu(monkeypatch)
    monkeypatch.delenv(knobs.DDP_BACKEND_ENV, raising=False)
    assert knobs.pick_device(1) == torch.device("cuda", 1) and chosen == [1]  # CUDA refuses it: a real error
    assert knobs.ddp_backend(torch.device("cuda", 1)) == "nccl"
