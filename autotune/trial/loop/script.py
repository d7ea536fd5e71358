"""A script pipeline's trial: the user's own script, run as written in this process (runpy, with its own
sys.argv and `__name__ == "__main__"`), with autotune's seams installed in torch before it starts.

No edit to the script:
  - DataLoader construction: the trial's num_workers, pin_memory, prefetch_factor, persistent_workers
    replace the script's own arguments (DataLoader.__init__ wrapped);
  - the optimizer's fused/foreach flags, set on its param groups before its first step (a global
    step pre-hook); zero_grad(set_to_none) on optimizers and modules; cudnn.benchmark and the thread
    count set before the script runs;
  - the lr for the trial's global batch: the lr each optimizer's constructor is given, scaled by the
    study's rule from the script's own global batch (Optimizer.__init__ wrapped, so a schedule built on
    it afterwards keeps its shape from the scaled lr); a script that calls at.lr() scales its own;
  - the data order: a config with a data seed (parity's data-order twin) hands each DataLoader a
    generator seeded with it; without one the script's own RNG decides, as it does alone;
  - measurement: the trial's one Clock (trial.measurement.clock), as every kind drives it: each loader
    the script starts iterating is told to it (what its workers make ahead is drained in the warm-up); a
    global optimizer-step post-hook ends each step; the time blocked in the DataLoader iterator's
    __next__, from a device sync, is the data wait; each backward()'s scalar is the step's loss; the
    samples of a step are what its loaders delivered, else at.batch_size() x at.accumulation() as handed
    over. After the timed steps the hook raises _Done, which ends the script and is caught here.
With the cooperative calls (autotune.script): at.batch_size() and at.accumulation() hand over the trial's
micro-batch and, under a study's global batch, its micro-batches per step; at.lr() the scaled lr.
The baseline (a config equal to the study's baseline knobs) runs the script's own settings: nothing is
overridden, and what the script set is recorded as observed.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from autotune.core.config import TrialConfig, TrialResult, baseline_of
from autotune.core.effects import knob_effect, lr_effect, refuse_unsupported, unsupported_effects
from autotune.core.errors import ConfigError
from autotune.pipelines import load_pipeline
from autotune.pipelines.frameworks import lr_scale
from autotune.pipelines.script import LOADER_KNOBS, ScriptJob, api, rule_of
from autotune.trial.loop import knobs
from autotune.trial.measurement import measure
from autotune.trial.measurement.clock import Clock

AS_WRITTEN = "the baseline runs the script's own settings"


class _Done(BaseException):
    """Raised from the step hook once the trial has measured enough: a BaseException, so a script's own
    `except Exception` does not swallow it."""


def is_as_written(cfg: TrialConfig) -> bool:
    """The baseline's knobs: run the script as it is, overriding nothing."""
    return cfg.knobs() == baseline_of(cfg).knobs()


class Seams:
    """What the trial installs in torch around the script, and what it saw there."""

    def __init__(
        self, cfg: TrialConfig, clock: Clock, as_written: bool, trial: api.Trial | None = None, own_lr: bool = False
    ) -> None:
        self.cfg, self.clock, self.as_written = cfg, clock, as_written
        self.trial = trial or api.Trial()
        self.own_lr = own_lr  # the script hands its lr through at.lr()
        self.loaders: list[dict[str, Any]] = []
        self.constructed: list[dict[str, Any]] = []  # each optimizer the script built: its type and lr
        self.optimizers: list[dict[str, Any]] = []
        self.zero_grads: list[bool] = []
        self.pending_samples = 0  # delivered by loaders since the last optimizer step
        self.pending_batches = 0
        self.step_samples: list[int] = []
        self.backward_losses: list[torch.Tensor] = []
        self.began = False
        self.hook_steps = 0

    # ---- DataLoader ---------------------------------------------------------------------------
    def loader_init(self, original: Any) -> Any:
        signature = inspect.signature(original)
        seams = self

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(loader, *args, **kwargs)
            # An IterableDataset yields its whole stream in every worker unless it shards itself: more
            # workers than the script chose would change what it trains on, so its loader keeps its own.
            iterable = isinstance(bound.arguments.get("dataset"), IterableDataset)
            if not seams.as_written and not iterable:
                bound.arguments |= loader_overrides(seams.cfg)
            if seams.cfg.data_seed is not None:  # parity's data-order twin: another order, the same weights
                bound.arguments["generator"] = torch.Generator().manual_seed(seams.cfg.data_seed)
            original(*bound.args, **bound.kwargs)
            record = {k: getattr(loader, k, None) for k in ("batch_size", *LOADER_KNOBS)}
            seams.loaders.append(
                record | ({"kept": "an IterableDataset: the script's own workers"} if iterable else {})
            )

        return __init__

    def loader_iter(self, original: Any) -> Any:
        seams = self

        def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            original(it, loader, *args, **kwargs)
            seams.clock.loader(loader)  # iterated: its workers now make batches ahead

        return __init__

    def loader_next(self, original: Any) -> Any:
        seams = self

        def __next__(it: Any) -> Any:
            seams.begin()
            seams.clock.fetching()
            try:
                batch = original(it)
            finally:
                seams.clock.fetched()
            seams.pending_samples += batch_len(batch)
            seams.pending_batches += 1
            return batch

        return __next__

    # ---- the optimizer ------------------------------------------------------------------------
    def optimizer_init(self, original: Any) -> Any:
        seams = self

        def __init__(optimizer: Any, params: Any, defaults: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            # A script whose source calls at.lr() scales its lr itself: not scaled again here (the call
            # may come after the constructor, as OneCycleLR's max_lr does).
            factor = 1.0 if seams.own_lr else seams.trial.lr_factor()
            lr = defaults.get("lr")
            if factor != 1 and lr is not None:
                defaults = {**defaults, "lr": lr * factor}
                params = list(params)  # param groups that give their own lr get it scaled too
                params = [{**g, "lr": g["lr"] * factor} if isinstance(g, dict) and "lr" in g else g for g in params]
            original(optimizer, params, defaults, *args, **kwargs)
            seams.constructed.append(
                {"type": type(optimizer).__name__, "lr": lr, "lr_set": defaults.get("lr"), "factor": factor}
            )

        return __init__

    def step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.begin()
        if getattr(optimizer, "_autotune_seen", False):
            return
        optimizer._autotune_seen = True  # type: ignore[attr-defined]
        group = optimizer.param_groups[0]
        record: dict[str, Any] = {"type": type(optimizer).__name__}
        if {"fused", "foreach"} <= set(group) and not self.as_written:
            fusion = self.cfg.optimizer_fusion
            for g in optimizer.param_groups:
                g["fused"], g["foreach"] = fusion == "fused", fusion == "foreach"
            # GradScaler hands a fused step its scale; another step must get unscaled gradients.
            optimizer._step_supports_amp_scaling = fusion == "fused"  # type: ignore[attr-defined]
        record["fusion"] = fusion_of(group)
        self.optimizers.append(record)

    def step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.hook_steps += 1
        self.step_samples.append(self.pending_samples)
        self.clock.batches_per_step = max(1, self.pending_batches)  # what the drain divides by
        self.pending_samples = self.pending_batches = 0
        counted = [n for n in self.step_samples if n] or [self.handed_samples()]
        self.clock.samples_per_step = sum(counted) / len(counted)
        if self.clock.step_end(self.step_loss()):
            raise _Done

    def handed_samples(self) -> int:
        """Samples per optimizer step as the cooperative calls handed them over (no loader counted any):
        the micro-batch x the micro-batches per step; 1 (steps/s) when the script hands over neither."""
        got = self.trial.returned
        return int(got.get("batch_size", 1)) * int(got.get("accumulation", 1)) if "batch_size" in got else 1

    def step_loss(self) -> float | None:
        if not self.backward_losses:
            return None
        total = float(sum(t.float() for t in self.backward_losses))
        self.backward_losses.clear()
        scalers = [s for s in self.trial.scalers if s.is_enabled()]  # at.scaler()'s, in the trial installed
        return total / float(scalers[0].get_scale()) if scalers else total

    def begin(self) -> None:
        if not self.began:
            self.began = True
            self.clock.begin()

    # ---- zero_grad and backward ---------------------------------------------------------------
    def zero_grad(self, original: Any) -> Any:
        seams = self

        def zero_grad(obj: Any, set_to_none: bool = True) -> None:
            if not seams.as_written:
                set_to_none = seams.cfg.set_to_none
            seams.zero_grads.append(set_to_none)
            original(obj, set_to_none=set_to_none)

        return zero_grad

    def backward(self, original: Any) -> Any:
        seams = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.numel() == 1:
                seams.backward_losses.append(tensor.detach())
            return original(tensor, *args, **kwargs)

        return backward


def batch_handover(cfg: TrialConfig, job: ScriptJob) -> dict[str, Any]:
    """What at.batch_size(), at.accumulation() and the lr scale hand the script: the config's micro-batch,
    and its micro-batches per step when the study fixes the global batch; nothing for a script whose
    batch is its own (it never calls at.batch_size(), or its default cannot be read)."""
    if job.own is None:
        return {}
    fixed = cfg.global_batch is not None

    def scale(own_batch: int, own_accum: int) -> float:
        # The global batch this trial runs: the study's, else the config's micro-batch x the script's
        # own accumulation; the user's lr is meant for the script's own.
        runs = cfg if fixed else cfg.replace(global_batch=cfg.batch_size * cfg.gpus * own_accum)
        return lr_scale(runs, own_batch * own_accum)

    return {
        "batch_size": cfg.batch_size,
        "accumulation": cfg.grad_accum if fixed else None,
        "own_batch_size": job.own[0],
        "own_accumulation": job.own[1],
        "lr_scale": scale,
    }


def loader_overrides(cfg: TrialConfig) -> dict[str, Any]:
    """The DataLoader arguments a config sets over the script's own."""
    kw: dict[str, Any] = {"num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory}
    workers = cfg.num_workers > 0  # DataLoader refuses both without worker processes
    kw["persistent_workers"] = cfg.persistent_workers if workers else False
    kw["prefetch_factor"] = cfg.loader_prefetch
    return kw


def fusion_of(group: dict[str, Any]) -> str:
    if group.get("fused"):
        return "fused"
    if group.get("foreach"):
        return "foreach"
    return "none" if "foreach" in group else "unknown"


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (tuples, lists, dicts); 1 without one."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = batch_len(item)
        if n:
            return n
    return 1


@contextlib.contextmanager
def installed(seams: Seams) -> Iterator[None]:
    """The seams in torch for the script's run, and torch as it was afterwards."""
    patches = [
        (DataLoader, "__init__", seams.loader_init(DataLoader.__init__)),
        (_BaseDataLoaderIter, "__init__", seams.loader_iter(_BaseDataLoaderIter.__init__)),
        (_BaseDataLoaderIter, "__next__", seams.loader_next(_BaseDataLoaderIter.__next__)),
        (torch.optim.Optimizer, "zero_grad", seams.zero_grad(torch.optim.Optimizer.zero_grad)),
        (torch.nn.Module, "zero_grad", seams.zero_grad(torch.nn.Module.zero_grad)),
        (torch.Tensor, "backward", seams.backward(torch.Tensor.backward)),
        (torch.optim.Optimizer, "__init__", seams.optimizer_init(torch.optim.Optimizer.__init__)),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    for owner, name, new in patches:
        setattr(owner, name, new)
    pre = register_optimizer_step_pre_hook(seams.step_pre)
    post = register_optimizer_step_post_hook(seams.step_post)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        for owner, name, old in saved:
            setattr(owner, name, old)


@contextlib.contextmanager
def as_main(job: ScriptJob) -> Iterator[None]:
    """sys.argv and sys.path[0] as `python script.py ARGS` has them, restored afterwards."""
    argv, path = sys.argv[:], sys.path[:]
    sys.argv = [job.path, *job.args]
    sys.path.insert(0, str(Path(job.path).parent))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = argv, path


def run(cfg: TrialConfig, progress: Path | None, launched: float) -> TrialResult:
    """One trial of a script pipeline: the script run until the trial's timed steps are done."""
    rank, world, local_rank = knobs.dist_env()
    device = knobs.pick_device(local_rank)
    applied: dict[str, Any] = knobs.setup_process(cfg, device)
    job = load_pipeline(cfg)
    assert isinstance(job, ScriptJob)
    refuse_unsupported(cfg, job.unsupported)
    as_written = is_as_written(cfg)
    clock = Clock(cfg, device, rank, world, progress, launched)
    trial = api.Trial(
        precision=cfg.precision,
        channels_last=cfg.channels_last,
        compile=cfg.compile,
        compile_backend=os.environ.get(knobs.COMPILE_BACKEND_ENV, "inductor"),
        seed=cfg.seed,
        data_seed=cfg.data_seed,
        device_type=device.type,
        **batch_handover(cfg, job),
    )
    seams = Seams(cfg, clock, as_written, trial, own_lr="lr" in job.uses.api)
    finished = execute(job, seams)
    clock.close(losses_per_rank=False)
    if not finished:  # a part-measured run is not this config's speed
        need = f"{cfg.timed_steps} timed" if cfg.seconds is None else f"{cfg.seconds:g} s of timed"
        raise ConfigError(
            f"the script ended after {seams.hook_steps} optimizer step(s), before {clock.untimed_steps} warm-up "
            f"and {need} step(s): give it more steps in its arguments"
        )
    applied |= unsupported_effects(cfg, job.unsupported) | observed(cfg, seams, trial, as_written, job.unsupported)
    extra = batch_and_lr(cfg, seams, trial, job)
    applied["script"] |= extra.pop("script")
    applied |= extra
    if cfg.profile:
        applied["profile"] = knob_effect(True, False, "the script owns the loop: profile it with torch.profiler")
    return clock.result(applied, measure.memory_total_bytes(device))


def execute(job: ScriptJob, seams: Seams) -> bool:
    """Run the script with the seams and their trial installed (what the script's at.* calls read); True
    when the trial stopped it after its timed steps, False when the script ended on its own first."""
    api.install(seams.trial)
    try:
        with installed(seams), as_main(job):
            runpy.run_path(job.path, run_name="__main__")
    except _Done:
        return True
    except SystemExit as e:  # the script's own sys.exit() before the trial measured enough
        if e.code not in (None, 0):
            raise ConfigError(
                f"the script exited with {e.code!r} after {seams.hook_steps} optimizer step(s); "
                "its own message is in the trial log"
            ) from None
    finally:
        api.install(None)
    return False


def observed(
    cfg: TrialConfig, seams: Seams, trial: api.Trial, as_written: bool, unsupported: frozenset[str]
) -> dict[str, Any]:
    """What each routed knob did in the script's process, in `applied`'s shape (an unsupported knob keeps
    its record, and why)."""
    why = AS_WRITTEN if as_written else ""
    out: dict[str, Any] = {
        "script": {
            "requested": None,
            "in_effect": None,
            "loaders": seams.loaders,
            "optimizers": seams.optimizers,
            "api_calls": dict(trial.calls),
            "optimizer_steps": seams.hook_steps,
            "samples_per_step": seams.clock.samples_per_step,
        }
    }
    loader = seams.loaders[0] if seams.loaders else None
    if loader:
        out["batch_size"] = knob_effect(cfg.batch_size, loader["batch_size"], "the script's own DataLoader batch size")
    for k in LOADER_KNOBS:
        if k in unsupported:
            continue
        out[k] = (
            knob_effect(getattr(cfg, k), loader[k], loader.get("kept", why))
            if loader
            else knob_effect(getattr(cfg, k), None, "the script built no DataLoader in this run")
        )
    if seams.optimizers:
        out["optimizer_fusion"] = knob_effect(cfg.optimizer_fusion, seams.optimizers[0]["fusion"], why)
    if seams.zero_grads:
        out["set_to_none"] = knob_effect(cfg.set_to_none, seams.zero_grads[-1], why)
    out["cudnn_benchmark"] = knob_effect(cfg.cudnn_benchmark, torch.backends.cudnn.benchmark, why)
    out["num_threads"] = knob_effect(cfg.num_threads, torch.get_num_threads(), why or "0 = torch default")
    if "autocast" in trial.calls:
        out["precision"] = knob_effect(cfg.precision, cfg.precision, "through at.autocast()")
    if "model" in trial.calls:
        convs = [p for m in trial.models for p in m.parameters() if p.dim() == 4]
        last = bool(convs) and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
        out["channels_last"] = knob_effect(cfg.channels_last, last, "through at.model()")
        out["compile"] = knob_effect(cfg.compile, cfg.compile, "through at.model()")
    return out


def batch_and_lr(cfg: TrialConfig, seams: Seams, trial: api.Trial, job: ScriptJob) -> dict[str, Any]:
    """The batch the script ran (handed over, or its own), its accumulation, the lr each optimizer was
    built with, and the lr rule: the study's, next to the one the optimizer that stepped follows."""
    out: dict[str, Any] = {}
    got, own = trial.returned, trial.defaults
    if job.own is not None and "batch_size" in got:
        why = "through at.batch_size()"
        if own["batch_size"] != job.own[0]:  # the source was read wrong: the baseline is not the script's own
            why += f"; the script's own default is {own['batch_size']}, not the {job.own[0]} its source reads"
        out["batch_size"] = knob_effect(cfg.batch_size, got["batch_size"], why)
    accumulation = got.get("accumulation", own.get("accumulation", job.own[1] if job.own else 1))
    built = seams.constructed[0] if seams.constructed else None
    stepped = seams.optimizers[0]["type"] if seams.optimizers else None
    rule: dict[str, Any] = {"rule": cfg.lr_scaling, "optimizer": stepped, "why": job.lr_rule_why}
    if cfg.lr_scaling != job.lr_rule:  # the user's --lr-scaling, over the rule read from the source
        rule["why"] = f"--lr-scaling {cfg.lr_scaling}, given (from the source: {job.lr_rule_why})"
    elif stepped is not None and rule_of(stepped) not in (None, cfg.lr_scaling):
        rule["why"] += (
            f"; the optimizer that stepped is {stepped}, whose rule is {rule_of(stepped)}: "
            f"give --lr-scaling {rule_of(stepped)}"
        )
    if "lr" in got:
        before, after = own["lr"], got["lr"]
    else:
        before, after = (built["lr"], built["lr_set"]) if built else (None, None)
    own_global = job.own[0] * job.own[1] if job.own else None
    runs = (got.get("batch_size", 0) or 0) * accumulation
    if own_global is not None and runs and before is not None:
        runs_cfg = cfg if cfg.global_batch else cfg.replace(global_batch=runs * cfg.gpus)
        out["lr"] = lr_effect(runs_cfg, before, after, own_global) | {"rule": rule}
    else:
        out["lr"] = knob_effect(before, after, "the script's own lr (its batch is its own)") | {"rule": rule}
    out["script"] = {"accumulation": accumulation, "optimizers_built": seams.constructed}
    return out
