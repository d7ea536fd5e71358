"""The seams a script trial installs in torch around the user's script, and what they see there (Seams),
handed over once the run stops as one record (`Seams.shown`, script/shown.py), with `installed`, which puts
them in torch for the run and takes them out afterwards. Their parts are in their own modules (loader, lr,
model, ranks; the model knobs' torch side in trial/loop/knobs/); records.py turns Shown into the trial's record; the
seams drive the trial's Clock (the step hook ends the timed window).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from autotune.core.config import TrialConfig
from autotune.core.knobs import loader as loader_knobs
from autotune.pipelines.script import ITERABLE_KEPT, LOADER_KNOBS, api
from autotune.trial.loop.knobs import optimizer_fusion, set_to_none
from autotune.trial.loop.script.lr import group_lrs, scale_own_schedule, set_for_the_batch_run, world_size
from autotune.trial.loop.script.loader import UNMEASURED, handed_batch, shuffled
from autotune.trial.loop.script.model import ModelSeams
from autotune.trial.loop.script.ranks import Ranks
from autotune.trial.loop.script.shown import Shown, per_step
from autotune.trial.loop.script.sites import call_site, plain, record_site
from autotune.trial.measurement import observe
from autotune.trial.measurement.clock import Clock
from autotune.trial.measurement.samples import batch_len


def handed_samples(trial: api.Trial, backwards: int = 0) -> int:
    """Samples per optimizer step where no loader counted any: the micro-batch at.batch_size() handed over
    x the backward passes the step ran (`backwards`, observed: a DDP script that divides its accumulation
    by the world size runs fewer than at.accumulation() handed over), else x the micro-batches per step
    handed over; 1 (steps/s) when the script hands over no batch."""
    got = trial.returned
    if "batch_size" not in got:
        return 1
    return int(got["batch_size"]) * (backwards or int(got.get("accumulation", 1)))


class Seams:
    """What the trial installs in torch around the script, and what it saw there.

    clock_for: the trial's Clock on a device, made when the script first fetches or steps, on the device
    its tensors live on (`machine`, where the script shows none).
    measured: `autotune run`'s (file, line) of the DataLoaders the exported trial iterated: the loader knobs
    are applied there only, as the diff writes them; None: at every DataLoader, as a trial applies them.
    whole: `autotune run`'s whole run: once the clock's window is measured the script is not stopped; the
    seams read what it showed and leave the clock alone, so it trains on with no sync or clock read per
    step, and the figures stay the window's."""

    def __init__(
        self,
        cfg: TrialConfig,
        clock_for: Callable[[torch.device], Clock],
        as_written: bool,
        trial: api.Trial | None = None,
        own_lr: bool = False,
        machine: torch.device | None = None,
        measured: Collection[tuple[str, int]] | None = None,
        routed: Collection[str] = (),
        whole: bool = False,
        ranks: Ranks | None = None,
    ) -> None:
        self.cfg, self.clock_for, self.as_written, self.measured = cfg, clock_for, as_written, measured
        self.whole = whole
        self.machine = machine or torch.device("cpu")
        # gpus for a script with no process group of its own: the trial's ranks (trial/loop/script/ranks.py).
        self.ranks = ranks or Ranks(self.machine, 0, 1)
        # The knobs applied to the model the optimizer trains, with no at.* call (trial/loop/script/model.py).
        self.model = ModelSeams(cfg, routed, as_written, self.ranks)
        self.clock: Clock | None = None
        self.trial = trial or api.Trial(device_type=self.machine.type)
        self.trial.watch = self.watch
        self.own_lr = own_lr  # the script hands its lr through at.lr()
        self.loaders: list[dict[str, Any]] = []
        self.iterated: list[Any] = []  # loaders iterated before the clock was made
        self.constructed: list[dict[str, Any]] = []  # each optimizer the script built: its type and lr
        self.schedules: list[LRScheduler] = []
        self.optimizers: list[dict[str, Any]] = []
        self.stepped: list[torch.optim.Optimizer] = []
        self.zero_grads: list[bool] = []
        self.pending_samples = 0  # delivered by loaders since the last optimizer step
        self.pending_batches = 0
        self.pending_backwards = 0  # backward passes of a scalar loss since the last optimizer step
        self.step_samples: list[int] = []
        self.step_backwards: list[int] = []
        self.step_batches: list[int] = []  # loader batches per optimizer step: the script's own accumulation
        self.shuffles: dict[int, bool] = {}  # each iterator the script drew from: does its order follow a seed
        self.seeds: list[Any] = []  # what the script gave torch.manual_seed in this run
        self.loss_sum: torch.Tensor | None = None  # this step's backward() scalars, summed (a copy)
        self.batch_pinned: bool | None = None  # the first batch a loader handed over
        self.outputs: list[observe.OutputDtype] = []  # the model at.model() got, and its first layer
        self.graphs_before: int | None = None  # dynamo's graph count when at.model() compiled
        self.final: dict[str, Any] = {}  # what the run showed, read when the trial stopped it
        self.began = False
        self.at = self.machine  # the device the clock syncs and reads memory on, once made
        self.hook_steps = 0
        # Where the script built each DataLoader and optimizer (the user's call: file, line, columns), what it
        # gave the knobs there and what ran, and whether the trial iterated or stepped it: what the diff edits.
        self.sites: dict[str, list[dict[str, Any]]] = {"loaders": [], "optimizers": []}

    @property
    def device(self) -> torch.device:
        """Where the script's tensors live: the model handed to at.model(), else its optimizer's parameters."""
        return self.trial.tensor_device() or self.machine

    @property
    def timing(self) -> bool:
        """The clock is made and its window not yet measured: the seams tell it each step."""
        return self.clock is not None and not self.after_window

    @property
    def after_window(self) -> bool:
        """A whole run past its measured window: nothing is timed or read any more."""
        return self.clock is not None and self.clock.over

    def begin(self) -> None:
        if not self.began:
            self.began = True
            self.at = self.device
            self.clock = self.clock_for(self.at)
            for loader in self.iterated:
                self.clock.loader(loader)
            self.clock.begin()

    def watch(self, module: torch.nn.Module) -> None:
        """The model at.model() got: its output's dtype and its first layer's (a model may cast its output
        back to float32; its first Linear or convolution shows the autocast it ran under), watched on its
        first forward. Not a model the trial compiles: dynamo would trace the hooks."""
        if self.trial.compile != "off":
            if self.graphs_before is None:
                self.graphs_before = observe.dynamo_graphs()
            return
        if self.outputs:
            return
        layer, name = observe.first_layer(module)
        self.outputs = [observe.OutputDtype(module, "the model at.model() got")]
        if layer is not None and layer is not module:
            self.outputs.append(observe.OutputDtype(layer, f"its first layer, {name}"))

    # ---- DataLoader ---------------------------------------------------------------------------
    def loader_init(self, original: Any) -> Any:
        signature = inspect.signature(original)
        seams = self

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            seams.ranks.decide()  # whose process group: the script's, if it exists by its first loader
            bound = signature.bind(loader, *args, **kwargs)
            own = {k: bound.arguments.get(k, signature.parameters[k].default) for k in ("batch_size", *LOADER_KNOBS)}
            if seams.trial.option_words() and own["batch_size"] == seams.trial.batch_size:
                own["batch_size"] = seams.trial.own_batch_size  # its own, before the trial gave its option
            # An IterableDataset yields its whole stream in every worker unless it shards itself: more
            # workers than the script chose would change what it trains on, so its loader keeps its own.
            iterable = isinstance(bound.arguments.get("dataset"), IterableDataset)
            where = call_site()
            unmeasured = seams.measured is not None and (where["file"], where["line"]) not in seams.measured
            if not seams.as_written and not iterable and not unmeasured:
                bound.arguments |= loader_knobs.arguments(seams.cfg) | handed_batch(seams.trial, bound.arguments, own)
            if seams.cfg.data_seed is not None:  # parity's data-order twin: another order, the same weights
                bound.arguments["generator"] = torch.Generator().manual_seed(seams.cfg.data_seed)
            trains = not seams.trial.through_loader or own["batch_size"] == seams.trial.own_batch_size
            if trains and not unmeasured:  # sharded over the trial's ranks, as DDP scripts do
                at = f"{where['file']}:{where['line']}"
                if iterable:
                    seams.ranks.unshardable(at)
                else:
                    bound.arguments |= seams.ranks.shard(bound.arguments, at)
            original(*bound.args, **bound.kwargs)
            record = {k: getattr(loader, k, None) for k in ("batch_size", *LOADER_KNOBS)}
            batches = loader.batch_sampler
            record["sampler"] = type(
                loader.sampler if batches is None else getattr(batches, "sampler", batches)
            ).__name__
            kept = ITERABLE_KEPT if iterable else UNMEASURED if unmeasured else None
            seams.loaders.append(record | ({"kept": kept} if kept else {}))
            ran = {k: record[k] for k in ("batch_size", *LOADER_KNOBS)}
            loader._autotune_site = record_site(seams.sites, "loaders", loader, own, ran, iterated=False)

        return __init__

    def loader_iter(self, original: Any) -> Any:
        seams = self

        def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            seams.ranks.new_pass(loader)
            original(it, loader, *args, **kwargs)
            site = getattr(loader, "_autotune_site", None)
            if site is not None:
                site["iterated"] = True
            if seams.clock is None:  # iterated: its workers now make batches ahead
                seams.iterated.append(loader)
            elif seams.timing:
                seams.clock.loader(loader)

        return __init__

    def loader_next(self, original: Any) -> Any:
        seams = self

        def __next__(it: Any) -> Any:
            seams.begin()
            if not seams.timing:
                batch = original(it)
            else:
                assert seams.clock is not None
                seams.clock.fetching()
                try:
                    batch = original(it)
                finally:
                    seams.clock.fetched()
            if seams.batch_pinned is None:
                seams.batch_pinned = observe.pinned(batch)
            seams.shuffles.setdefault(id(it), shuffled(it))
            if torch.is_grad_enabled():  # under no_grad or inference_mode: an evaluation's batch, trains nothing
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
            seams.trial.optimizers.append(optimizer)
            seams.model.arm(optimizer)
            record = {"type": type(optimizer).__name__, "lr": lr, "lr_set": defaults.get("lr"), "factor": factor}
            optimizer._autotune_built = record
            seams.constructed.append(record)
            own: dict[str, Any] = {k: defaults.get(k) for k in ("fused", "foreach") if k in defaults}
            optimizer._autotune_site = record_site(seams.sites, "optimizers", optimizer, own, None, stepped=False)
            optimizer._autotune_lrs = group_lrs(optimizer)

        return __init__

    def schedule_init(self, original: Any) -> Any:
        seams = self

        def __init__(schedule: Any, *args: Any, **kwargs: Any) -> None:
            original(schedule, *args, **kwargs)
            seams.schedules.append(schedule)

        return __init__

    def scaler_call(self, original: Any) -> Any:
        """GradScaler.step / unscale_: the optimizer prepared before the scaler reads its flags."""
        seams = self

        def call(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            seams.prepare(optimizer)
            return original(scaler, optimizer, *args, **kwargs)

        return call

    def step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not any(s.optimizer is optimizer for s in self.schedules):  # a torch schedule computes from the scaled lr
            scale_own_schedule(optimizer)
        self.prepare(optimizer)

    def prepare(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per optimizer, before its first step and before GradScaler sees it: the trial's fused /
        foreach flags (and whether GradScaler hands it the scale: a fused step unscales in its kernel, the
        others must get unscaled gradients), and its lr set for the global batch its first step runs."""
        self.begin()
        if getattr(optimizer, "_autotune_seen", False):
            return
        self.ranks.check()
        optimizer._autotune_seen = True  # type: ignore[attr-defined]
        group = optimizer.param_groups[0]
        record: dict[str, Any] = {"type": type(optimizer).__name__}
        if not self.as_written:
            optimizer_fusion.seam(optimizer, self.cfg.optimizer_fusion)
        record["fusion"] = optimizer_fusion.fusion_of(group)
        self.optimizers.append(record)
        self.stepped.append(optimizer)
        handed = "batch_size" in self.trial.returned
        consumed = self.pending_samples or (handed_samples(self.trial, self.pending_backwards) if handed else 0)
        schedules = [s for s in self.schedules if s.optimizer is optimizer]
        set_for_the_batch_run(optimizer, schedules, self.trial, self.cfg, consumed, self.own_lr)

    def step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        assert self.clock is not None
        site = getattr(optimizer, "_autotune_site", None)
        if site is not None and not site["stepped"]:
            site |= {"stepped": True, "ran": optimizer_fusion.fusion_of(optimizer.param_groups[0])}
        optimizer._autotune_lrs = group_lrs(optimizer)  # type: ignore[attr-defined]
        self.hook_steps += 1
        self.step_samples.append(self.pending_samples)
        self.step_batches.append(self.pending_batches)
        self.step_backwards.append(self.pending_backwards)
        batches = self.pending_batches
        self.pending_samples = self.pending_batches = self.pending_backwards = 0
        if not self.timing:  # a whole run after its window: the clock is closed
            return
        self.clock.batches_per_step = max(1, batches)  # what the drain divides by
        counted = [n for n in self.step_samples if n] or [self.consumed_without_loaders()]
        self.clock.samples_per_step = sum(counted) / len(counted)
        if self.clock.step_end(self.step_loss()):
            self.finish()
            if not self.whole:
                self.clock.raise_if_over()  # WindowOver ends the script, caught where it was run

    def consumed_without_loaders(self) -> int:
        """A rank's samples per optimizer step where no loader counted them: the handed-over micro-batch, else
        the batch its model was fed, x the backward passes its steps ran (the most common count: what its
        steps consumed, observed)."""
        backwards = per_step(self.step_backwards)
        if "batch_size" not in self.trial.returned and self.model.fed:  # its own batch, as its model was fed
            return self.model.fed * max(1, backwards)
        return handed_samples(self.trial, backwards)

    def seed_call(self, original: Any) -> Any:
        """torch.manual_seed: recorded, so the trial says whether this run started from the seed's weights
        (a script may seed only under a flag it was not given)."""
        seams = self

        def manual_seed(seed: Any) -> Any:
            seams.seeds.append(int(seed) if isinstance(seed, int) else str(seed))
            return original(seed)

        return manual_seed

    def step_loss(self) -> float | None:
        if self.loss_sum is None:
            return None
        total = float(self.loss_sum)
        self.loss_sum = None
        scalers = [s for s in self.trial.scalers if s.is_enabled()]  # at.scaler()'s, in the trial installed
        return total / float(scalers[0].get_scale()) if scalers else total

    def finish(self) -> None:
        """The trial has measured enough: the clock closes while the script's process group (if any) still
        exists (the script may tear it down as WindowOver unwinds it), and what the run showed is read now: the
        ranks, the global batch (each rank's loaders' samples per step, summed), the model's and
        optimizer's devices, the output dtypes."""
        assert self.clock is not None
        self.clock.close(losses_per_rank=True)
        per_rank = per_step(self.step_samples) or self.consumed_without_loaders()
        world, global_batch = world_size(), per_rank
        if world > 1:
            t = torch.tensor([float(per_rank)], dtype=torch.float64, device=self.at)
            dist.all_reduce(t)  # SUM over ranks
            global_batch = int(t.item())
        model = self.trial.models[0] if self.trial.models else self.model.model  # at.model()'s, else the one found
        seen: dict[str, Any] = {}
        for output in self.outputs:
            seen.setdefault("output_dtype", output.seen.get("output_dtype"))
            seen.setdefault("output_of", output.seen.get("output_of"))
            if output is not self.outputs[0] and output.seen:
                seen["first_layer_output_dtype"] = output.seen["output_dtype"]
            output.close()
        optimizer = self.stepped[0] if self.stepped else None
        seen |= observe.in_job(model, optimizer, self.at, self.clock.util)
        seen |= {"batch_pinned": self.batch_pinned, "world_size": world, "global_batch": global_batch}
        seen["samples_per_step_per_rank"] = per_rank
        seen["device"] = str(self.at)
        if self.graphs_before is not None:
            seen["compiled_graphs"] = (observe.dynamo_graphs() or 0) - self.graphs_before
        seen |= self.model.observed()
        if (ranks := self.ranks.record()) is not None:
            seen |= {"ranks": ranks, "sharded_loaders": self.ranks.sharded}
        self.final = seen

    def shown(self) -> Shown:
        """What the run showed, handed over once it stopped: the one record each knob's part reads."""
        return Shown(
            loaders=tuple(self.loaders),
            built=tuple(self.constructed),
            stepped=tuple(self.optimizers),
            zero_grads=tuple(self.zero_grads),
            step_samples=tuple(self.step_samples),
            step_batches=tuple(self.step_batches),
            step_backwards=tuple(self.step_backwards),
            fed=self.model.fed,
            steps=self.hook_steps,
            samples_per_step=self.clock.samples_per_step if self.clock is not None else None,
            # the lr each stepped optimizer's first group ran its last step at (after the script's own schedule)
            lr_last_step=tuple(plain(lrs[0]) for o in self.stepped if (lrs := getattr(o, "_autotune_lrs", None))),
            seeds=tuple(self.seeds),
            shuffled=any(self.shuffles.values()),
            process_group=self.ranks.process_group(),  # whose: "own", "trial", None (what trial 0 teaches)
            final=self.final,
            sites=self.sites | ({"model": site} if (site := self.model.site()) else {}),
            model=self.model.record(),
            model_seen=self.model.knobs_seen(),
        )

    # ---- backward ---------------------------------------------------------------------------
    def backward(self, original: Any) -> Any:
        seams = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.numel() == 1:
                seams.pending_backwards += 1  # one micro-batch's backward: what a step consumed, without a loader
            if tensor.numel() == 1 and not seams.after_window:
                # A copy summed on the device, read once at the step's end: the script's own tensor is not
                # held across steps (under CUDA graphs its storage is the graph's, rewritten by a replay).
                copy = tensor.detach().to(torch.float32, copy=True).reshape(())
                seams.loss_sum = copy if seams.loss_sum is None else seams.loss_sum.add_(copy)
            return original(tensor, *args, **kwargs)

        return backward


@contextlib.contextmanager
def installed(seams: Seams) -> Iterator[None]:
    """The seams in torch for the script's run, and torch as it was afterwards."""
    own = None if seams.as_written else seams.cfg.set_to_none  # zero_grad's: None, each call's own
    patches: list[tuple[Any, str, Any]] = [
        (DataLoader, "__init__", seams.loader_init(DataLoader.__init__)),
        (_BaseDataLoaderIter, "__init__", seams.loader_iter(_BaseDataLoaderIter.__init__)),
        (_BaseDataLoaderIter, "__next__", seams.loader_next(_BaseDataLoaderIter.__next__)),
        (torch.optim.Optimizer, "zero_grad", set_to_none.seam(torch.optim.Optimizer.zero_grad, own, seams.zero_grads)),
        (torch.nn.Module, "zero_grad", set_to_none.seam(torch.nn.Module.zero_grad, own, seams.zero_grads)),
        (torch.Tensor, "backward", seams.backward(torch.Tensor.backward)),
        (torch.optim.Optimizer, "__init__", seams.optimizer_init(torch.optim.Optimizer.__init__)),
        (LRScheduler, "__init__", seams.schedule_init(LRScheduler.__init__)),
        (torch.amp.GradScaler, "unscale_", seams.scaler_call(torch.amp.GradScaler.unscale_)),
        (torch.amp.GradScaler, "step", seams.scaler_call(torch.amp.GradScaler.step)),
    ]
    patches += [(module, "manual_seed", seams.seed_call(torch.random.manual_seed)) for module in (torch, torch.random)]
    if dist.is_available():
        patches.append((dist, "init_process_group", seams.ranks.group_call(dist.init_process_group)))
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
        for output in seams.outputs:
            output.close()
        seams.model.close()
