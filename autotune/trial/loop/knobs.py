"""Apply each knob to a pipeline. Every function returns what it really put in effect.

Switches are built as no-ops where possible (GradScaler(enabled=...)), so the trial loop
has one shape whatever the config.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Any
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from autotune.core.config import TrialConfig
from autotune.core.effects import knob_effect, lr_effect
from autotune.core.cpus import usable_cpus
from autotune.core.errors import ConfigError, TrialUnsupported

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _ranks_on_this_node() -> int | None:
    """How many torchrun ranks share this machine's cores; None for a plain process."""
    n = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE")
    return int(n) if n else None


def setup_process(cfg: TrialConfig, device: torch.device) -> dict[str, Any]:
    applied: dict[str, Any] = {}
    ranks = _ranks_on_this_node()
    why = ""
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    elif ranks is not None:
        # torchrun sets OMP_NUM_THREADS=1 in every rank when it is unset, so "torch's default" would
        # mean all cores for gpus=1 but one thread per rank under DDP: a bias against DDP. Give the
        # ranks on this node an equal share of the cores this process may run on instead: its affinity
        # mask, capped by the container's CPU quota (two ranks in an 8-CPU pod on a 64-core host: 4 each).
        cpus = usable_cpus()
        torch.set_num_threads(max(1, cpus // ranks))
        why = f"0 = the {cpus} usable cores (affinity, CPU quota) shared by the {ranks} ranks on this node"
    else:
        why = "0 = torch default"
    applied["num_threads"] = knob_effect(cfg.num_threads, torch.get_num_threads(), why)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    applied["cudnn_benchmark"] = knob_effect(
        cfg.cudnn_benchmark,
        cfg.cudnn_benchmark and cuda,
        "" if cuda or not cfg.cudnn_benchmark else "no CUDA device: cudnn is unused",
    )
    return applied


class CheckpointedStage(nn.Module):
    """Recompute this stage's activations in backward instead of keeping them."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        # Parents may read attributes of the stage they hold (nn.TransformerEncoder reads
        # layers[0].self_attn): the wrapper must stay transparent.
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # Non-reentrant: works with kwargs, with DDP, and with inputs that need no grad.
        if torch.compiler.is_compiling():
            # Compiled, the recompute is the partitioner's: it replays pure ops only, and the buffer
            # updates (running stats) stay in the forward graph, once. Dynamo takes no custom context_fn.
            return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
        return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self._contexts, **kwargs)

    def _contexts(self) -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
        return contextlib.nullcontext(), running_stats_kept(self.inner)


_RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


@contextlib.contextmanager
def running_stats_kept(module: nn.Module) -> Iterator[None]:
    """Batch norm's running statistics as they are, whatever runs inside: the checkpoint's recompute is a
    second forward in train mode, which would update them (and num_batches_tracked) twice per step. The
    recompute writes into throwaway copies instead; normalisation uses the batch's own statistics in
    train mode, so its output (and the gradients) are unchanged. The original buffers are put back, not
    overwritten in place: autograd and DDP's buffer broadcast hold references to them."""
    kept: list[tuple[nn.Module, str, torch.Tensor]] = []
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats:
            for name in _RUNNING_STATS:
                buf = m._buffers.get(name)
                if buf is not None:
                    kept.append((m, name, buf))
                    m._buffers[name] = buf.clone()
    try:
        yield
    finally:
        for m, name, buf in kept:
            m._buffers[name] = buf


def wrap_checkpoints(model: nn.Module, stages: Iterable[str], k: int) -> dict[str, Any]:
    stages = list(stages)
    if k > len(stages):
        raise TrialUnsupported(f"checkpoint_segments={k} but the pipeline declares {len(stages)} stages")
    for name in stages[:k]:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, CheckpointedStage(getattr(parent, attr)))
    return {"checkpoint_segments": knob_effect(k, stages[:k])}


# torch.compile's backend: inductor unless set. aot_eager runs dynamo and its DDP optimizer (the graph split
# at bucket boundaries, where higher-order ops such as checkpoint were once refused) without inductor's
# minutes of code generation on a CPU, so the tests can prove compile + DDP + checkpointing trains.
COMPILE_BACKEND_ENV = "AUTOTUNE_COMPILE_BACKEND"


def prepare_model(
    model: nn.Module, cfg: TrialConfig, device: torch.device, world: int
) -> tuple[nn.Module, dict[str, Any]]:
    applied: dict[str, Any] = {}
    model = model.to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    applied["channels_last"] = knob_effect(cfg.channels_last, cfg.channels_last)
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    applied["gpus"] = knob_effect(cfg.gpus, world, _ddp_why(world, device))
    if cfg.compile != "off":
        # mode is inductor's; another backend (the tests' aot_eager) takes none.
        backend = os.environ.get(COMPILE_BACKEND_ENV, "inductor")
        model = torch.compile(model, backend=backend, mode=cfg.compile if backend == "inductor" else None)  # type: ignore[assignment]
    applied["compile"] = knob_effect(cfg.compile, cfg.compile)
    return model, applied


def _ddp_why(world: int, device: torch.device) -> str:
    if world == 1:
        return ""
    if device.type != "cuda":
        return f"{world} CPU processes over gloo"
    if ddp_backend(device) == "gloo":
        return f"{world} processes over gloo ({DDP_BACKEND_ENV}), rank r on GPU r mod {torch.cuda.device_count()}"
    return ""


def apex_available() -> bool:
    """NVIDIA apex with its CUDA extension built: `apex.optimizers` alone imports without it (a
    Python-only build), and then FusedAdam fails at its first step."""
    try:
        if importlib.util.find_spec("apex.optimizers") is None:
            return False
        importlib.import_module("amp_C")  # the compiled kernels FusedAdam calls
    except (ImportError, ValueError, OSError):  # ValueError: a half-installed package without __spec__
        return False
    return True


# torch.optim.AdamW's own default; apex's FusedAdam defaults to 0, so it is passed to both explicitly:
# apex vs torch must compare the same training.
WEIGHT_DECAY = 0.01


def apex_runs_on(device: torch.device) -> bool:
    """apex's FusedAdam is GPU-only: its constructor and kernels need CUDA."""
    return device.type == "cuda"


def build_optimizer(
    params: Iterable[nn.Parameter], cfg: TrialConfig, device: torch.device | None = None
) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer_fusion == "apex":
        if not apex_available():
            raise TrialUnsupported("optimizer_fusion=apex but NVIDIA apex (apex.optimizers) is not installed")
        if device is not None and not apex_runs_on(device):
            raise TrialUnsupported(
                f"optimizer_fusion=apex needs a CUDA device (apex's FusedAdam is GPU-only), not {device}"
            )
        from apex.optimizers import FusedAdam

        # Its zero_grad() takes no argument: set_to_none is given here, as set_grad_none (see zero_grad).
        opt = FusedAdam(
            params, lr=cfg.effective_lr, adam_w_mode=True, weight_decay=WEIGHT_DECAY, set_grad_none=cfg.set_to_none
        )
        return opt, {
            "lr": lr_effect(cfg, cfg.lr, cfg.effective_lr),
            "optimizer_fusion": knob_effect("apex", f"apex.FusedAdam(adam_w_mode=True, weight_decay={WEIGHT_DECAY})"),
        }
    # foreach=False forces the per-parameter for-loop: that is what "none" means.
    kwargs = {"none": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[cfg.optimizer_fusion]
    opt = torch.optim.AdamW(params, lr=cfg.effective_lr, weight_decay=WEIGHT_DECAY, **kwargs)  # type: ignore[arg-type]  # a dict of bools: mypy matches it to betas
    return opt, {
        "lr": lr_effect(cfg, cfg.lr, cfg.effective_lr),
        "optimizer_fusion": knob_effect(
            cfg.optimizer_fusion,
            f"torch.optim.AdamW({next(iter(kwargs))}=True)"
            if cfg.optimizer_fusion != "none"
            else "torch.optim.AdamW(foreach=False)",
        ),
    }


def no_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager[Any]:
    """DDP's no_sync() for an accumulating micro-step (not the last): its gradients stay local, and the
    last micro-step's backward all-reduces the sum. A no-op without DDP."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile wraps DDP
    if last or not isinstance(inner, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return inner.no_sync()


def zero_grad(optimizer: torch.optim.Optimizer, cfg: TrialConfig) -> None:
    if cfg.optimizer_fusion != "apex":
        optimizer.zero_grad(set_to_none=cfg.set_to_none)
    elif cfg.set_to_none:
        optimizer.zero_grad()  # apex's own: no argument, it reads set_grad_none
    else:
        # apex's zero_grad() with set_grad_none=False calls torch's Optimizer.zero_grad() with its
        # default, set_to_none=True since torch 2.0: the request would silently not take effect.
        torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)


def to_device(t: torch.Tensor, device: torch.device, cfg: TrialConfig) -> torch.Tensor:
    # non_blocking only overlaps the copy when the source is pinned; harmless otherwise.
    fmt = torch.channels_last if cfg.channels_last and t.dim() == 4 else torch.contiguous_format
    return t.to(device, non_blocking=cfg.pin_memory, memory_format=fmt)


class Precision:
    """autocast + GradScaler, both present on every path; fp32 disables them."""

    def __init__(self, cfg: TrialConfig, device: torch.device) -> None:
        self.device_type = device.type
        self.dtype = DTYPES[cfg.precision]
        self.enabled = cfg.precision != "fp32"
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
        why = ""
        if cfg.precision == "fp16" and device.type != "cuda":
            why = "no CUDA device: fp16 autocast runs on CPU, without tensor cores"
        self.applied = {
            "precision": knob_effect(
                cfg.precision, f"autocast({device.type}, {cfg.precision})" if self.enabled else "fp32", why
            ),
            "grad_scaler": self.scaler.is_enabled(),
        }

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


def dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) as torchrun sets them; (0, 1, 0) for a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


# "gloo": DDP over gloo, which carries CUDA tensors for DDP's broadcast and all-reduce, so ranks may share
# a GPU (NCCL refuses two ranks on one device): every DDP path runs on CUDA on a one-GPU machine. Its
# speed means nothing; its correctness does. "nccl": the default on CUDA, named. Unset: nccl on CUDA,
# gloo on CPU.
DDP_BACKEND_ENV = "AUTOTUNE_DDP_BACKEND"
DDP_BACKENDS = ("gloo", "nccl")


def ddp_backend(device: torch.device) -> str:
    chosen = os.environ.get(DDP_BACKEND_ENV, "").strip().lower()
    if not chosen:
        return "nccl" if device.type == "cuda" else "gloo"
    if chosen not in DDP_BACKENDS:
        raise ConfigError(f"{DDP_BACKEND_ENV}={chosen!r}: expected one of {', '.join(DDP_BACKENDS)}")
    if chosen == "nccl" and device.type != "cuda":
        raise ConfigError(f"{DDP_BACKEND_ENV}=nccl needs CUDA; this process runs on {device}")
    return chosen


def ranks_share_gpus() -> bool:
    """Several ranks on one GPU, as AUTOTUNE_DDP_BACKEND=gloo allows: rank r takes GPU r mod count."""
    return os.environ.get(DDP_BACKEND_ENV, "").strip().lower() == "gloo"


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count() if ranks_share_gpus() else local_rank
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")
