"""gpus for a script that sets up no process group of its own: under torchrun, one process per GPU, the trial
sets the group up where the run shows none (no group exists when the script builds its first DataLoader, first
calls the model its optimizer trains, or first steps, whatever its source contains: a call under a flag it was
not given sets up nothing), makes the model its optimizer trains data-parallel in place (torch's
composable `replicate`: DDP, with the module's own names and class kept, so its state_dict is the script's),
hands each training DataLoader a DistributedSampler (its epoch set at each pass, its seed drawn from the
script's own RNG and agreed on by rank 0, so the order follows the script's seeding and the ranks' shards are
disjoint), and keeps ranks other than 0 quiet: they print nothing and skip torch.save, so the script's
checkpoint is written once. A script whose group exists by then keeps it (none of this runs); one that sets it
up later, over the trial's, is refused with why, as is a group of another size than the ranks torchrun started:
a rank count that was not realised never counts as a run on that many GPUs.

A rank that cannot shard what it trains on (a DataLoader with its own sampler, an IterableDataset, no model
found before the first step) would train every rank on the same batches: the trial stops with why (exit 5).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._composable.replicate import replicate
from torch.utils.data import DistributedSampler

from autotune.core.errors import TrialUnsupported
from autotune.trial.loop import knobs

HOW = (
    "the script sets up no process group: the trial set it up ({backend}), replicated {model} in place "
    "(torch's composable replicate, DDP) and sharded {loaders} training DataLoader(s) with a DistributedSampler"
)
QUIET = "ranks other than 0 print nothing and skip torch.save: the script's files are written once, by rank 0"


class Ranks:
    """One rank of a script run on several processes: by the trial (`active`, once `decide` has found no
    process group), by the script's own group (`own_group`), or nothing to do (world 1)."""

    def __init__(self, machine: torch.device, rank: int, world: int) -> None:
        self.machine, self.rank, self.world = machine, rank, world
        self.decided = False
        self.own_group = False  # a process group existed when the run first needed one: the script's
        self.active = False
        self.backend: str | None = None
        self.model: str | None = None  # the class of the model replicated
        self.sharded = 0
        self.unsharded: list[str] = []  # why a training loader the script built keeps its own order
        self.saves = {"written": 0, "skipped": 0}
        self.group_seen = False  # a process group existed at the first step (the model has run by then)
        self._restore: list[Any] = []  # what quiet() put in place for the trial's ranks, undone at its end

    def decide(self) -> None:
        """Once, at the first DataLoader, model call or step: a process group that exists now is the script's
        own; where none does and torchrun started several ranks, the trial sets one up and runs them."""
        if self.decided:
            return
        self.decided = True
        self.own_group = dist.is_available() and dist.is_initialized()
        if self.world > 1 and not self.own_group:
            self.backend = knobs.ddp_backend(self.machine)
            dist.init_process_group(self.backend)
            self.active = True  # after: a call to init_process_group from here on is the script's (group_call)
            self._quiet()

    def group_call(self, original: Any) -> Any:
        """torch.distributed.init_process_group while the script runs: a group set up after the trial set up
        its own (the script built its loader or called its model first) is refused with why."""
        ranks = self

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            if ranks.active:
                raise TrialUnsupported(
                    f"gpus {ranks.world}: the script set up its process group after it built its DataLoader or "
                    "called its model, where the trial had set up its own: set it up first"
                )
            return original(*args, **kwargs)

        return init_process_group

    def teardown(self) -> None:
        """The group the trial set up, taken down once every rank is done with it (`autotune run`: a trial's
        worker takes it down itself)."""
        if self.backend is not None and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    # ---- the model ----------------------------------------------------------------------------
    def replicate(self, model: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The model made data-parallel in place at its first call: its parameters broadcast from rank 0, its
        gradients averaged over the ranks in backward. replicate's pre-hook is added while this call's pre-hooks
        already run, so it is called here for this call (its forward hook is read after the forward: it runs)."""
        self.decide()
        if not self.active:
            return args
        self.model = type(model).__name__
        replicate(model, device_id=self.machine)  # a CPU device: DDP's device_ids=None
        out = replicate.state(model).forward_pre_hook(model, args, {})
        return tuple(out[0]) if isinstance(out, tuple) else args

    # ---- the loaders --------------------------------------------------------------------------
    def shard(self, arguments: dict[str, Any], where: str) -> dict[str, Any]:
        """The DataLoader arguments that give this rank its shard of a training loader: a DistributedSampler
        over its dataset, shuffled as the script asked, seeded from the script's own RNG (the loader's
        generator where it has one) as rank 0 drew it. A loader with a sampler of its own keeps it, said."""
        if not self.active:
            return {}
        for own in ("sampler", "batch_sampler"):
            if arguments.get(own) is not None:
                self.unsharded.append(f"the DataLoader at {where} has a {own} of its own")
                return {}
        generator = arguments.get("generator")
        seed = [int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())]
        dist.broadcast_object_list(seed, src=0)
        sampler: DistributedSampler[Any] = DistributedSampler(
            arguments["dataset"],
            num_replicas=self.world,
            rank=self.rank,
            shuffle=bool(arguments.get("shuffle")),
            seed=seed[0],
        )
        sampler._autotune_passes = 0  # type: ignore[attr-defined]
        self.sharded += 1
        return {"sampler": sampler, "shuffle": None}

    def unshardable(self, where: str) -> None:
        """A training loader the trial cannot shard (an IterableDataset): said, and refused at the first step."""
        self.decide()
        if self.active:
            self.unsharded.append(f"the DataLoader at {where} loads an IterableDataset")

    @staticmethod
    def new_pass(loader: Any) -> None:
        """A pass over a sharded loader begins: its sampler's epoch set, as DDP scripts do, so each epoch has
        another order (the same on every rank)."""
        sampler = getattr(loader, "sampler", None)
        passes = getattr(sampler, "_autotune_passes", None)
        if isinstance(sampler, DistributedSampler) and passes is not None:
            sampler.set_epoch(passes)
            sampler._autotune_passes = passes + 1  # type: ignore[attr-defined]

    def check(self) -> None:
        """Before the first optimizer step: every rank trains a replicated model on its own shard, or the trial
        stops with why; a group the script set up has the ranks torchrun started."""
        self.decide()
        self.group_seen = dist.is_available() and dist.is_initialized()
        if self.own_group and self.world > 1 and (size := dist.get_world_size()) != self.world:
            raise TrialUnsupported(
                f"gpus {self.world}: the script's own process group has {size} rank(s), not the {self.world} started"
            )
        if not self.active:
            return
        if self.model is None:
            raise TrialUnsupported(
                f"gpus {self.world}: the script sets up no process group and its optimizer stepped before it "
                "called the model it trains (no model found to replicate): set up DDP in the script"
            )
        if self.unsharded or not self.sharded:
            why = "; ".join(self.unsharded) or "the script iterated no DataLoader the trial could shard"
            raise TrialUnsupported(
                f"gpus {self.world}: every rank would train on the same batches ({why}): give it a "
                "DistributedSampler and set up its process group in the script"
            )

    # ---- what other ranks write ---------------------------------------------------------------
    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """While the script runs: once the trial runs the ranks (decide), ranks other than 0 print nothing and
        skip torch.save, and rank 0 counts its saves; all as it was afterwards."""
        try:
            yield
        finally:
            for owner, name, value in reversed(self._restore):
                setattr(owner, name, value)
            self._restore = []

    def _quiet(self) -> None:
        original = torch.save

        def save(*args: Any, **kwargs: Any) -> None:
            if self.rank == 0:
                self.saves["written"] += 1
                original(*args, **kwargs)
            else:
                self.saves["skipped"] += 1

        self._restore = [(torch, "save", original), (sys, "stdout", sys.stdout)]
        torch.save = save
        if self.rank != 0:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (closed with the process)

    def process_group(self) -> str | None:
        """Whose process group the run had: "own" (the script's), "trial" (the trial's), None (none)."""
        return "trial" if self.active else "own" if self.group_seen or self.own_group else None

    def record(self) -> dict[str, Any] | None:
        """What the trial did to run the script on several ranks, with each rank's saves (gathered: a
        collective, so every rank calls it while the group lives); None when it did nothing."""
        if not self.active:
            return None
        saves: list[Any] = [None] * self.world
        dist.all_gather_object(saves, self.saves)
        return {
            "how": HOW.format(backend=self.backend or dist.get_backend(), model=self.model, loaders=self.sharded),
            "others": QUIET,
            "torch_save": {k: [s[k] for s in saves] for k in ("written", "skipped")},
        }
