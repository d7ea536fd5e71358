"""`--pipeline script:PATH [ARGS...]`: the user's own training script, run as written in each trial.

The spec holds the script's absolute path and its own command-line arguments, shell-quoted
(`script:/abs/train.py --epochs 1 data/`), so every trial, a worker, and `autotune trial --config
best.yaml` re-run the same command with no new TrialConfig field. autotune.trial.loop.script runs it with
runpy, its seams installed in torch first; this package owns what needs no trial: the spec, the checks
on the file, and which knobs the script can take (what its source routes is read in source.py).

Which knobs a script takes is decided statically, from its source (`ast`), before the first trial:
  - the no-edit knobs (optimizer_fusion, set_to_none, cudnn_benchmark, num_threads) reach any script
    through torch's own seams; optimizer_fusion only an optimizer whose constructor takes the
    fused/foreach pair (fusion.py);
  - the loader knobs need a `DataLoader` in the script's source, or in a module it imports from its own
    folder (modules.py), as the optimizers below;
  - the model knobs of the knob list (autotune/core/knobs/) reach the model the script's optimizer trains
    with no edit (trial/loop/script/model.py, each by its module's torch side), unless the script routes one
    itself through the at.* call its module names (`ROUTE`: at.autocast(), at.model(); the cooperative API,
    autotune.script); a knob whose value the script gives that call (at.autocast("bf16")) has its rules
    there in its module (`script_own`, `script_why`, `script_refused`: fp16 needs `at.scaler()` too),
    and a script that gives none runs as trial 0's model showed;
  - gpus: the script runs under torchrun, one process per GPU, each rank with the seams. One that sets up its
    own process group (a call to init_process_group or init_device_mesh, by any spelling) keeps its own DDP
    set-up untouched; for one that sets up none, the trial sets it up, replicates its model (DDP) and shards
    its training DataLoaders (trial/loop/script/ranks.py), so it needs a DataLoader;
  - batch_size reaches a script that builds its batches with a torch DataLoader with no edit: the trial
    replaces the batch_size of the DataLoaders built with the script's own (trial/loop/script/loader.py),
    which is read from its DataLoader's batch_size (an int, a name assigned once, an argparse option's
    default), else from what trial 0's loaders delivered; a script that builds its batches itself hands
    them over with `at.batch_size(default)` (whose default is then its own); under a study's
    --global-batch, a script that calls no `at.accumulation()` keeps its own accumulation, and each GPU
    count runs the global batch divided over its ranks (TrialConfig.keeps_accumulation);
  - the lr rule for a changed global batch follows the optimizer the script constructs: linear for
    SGD, sqrt for the Adam family (`lr_rule`), unless the user gives --lr-scaling.
A static declaration is chosen over a probe run because it is free, known before the space is
resolved, and cannot be fooled by a first run that takes another branch; the trial then records what
each knob really did (`applied`), so a seam the scan credited but the run never reached says so.

May import: autotune.core, autotune.pipelines (never torch at import).
"""

from __future__ import annotations

import ast
import dataclasses
import shlex
from math import prod
from pathlib import Path
from collections.abc import Collection, Mapping
from typing import Any

from autotune.core import knobs
from autotune.core.config import LEADS, TrialConfig, dependents, lr_factor
from autotune.core.errors import PipelineError
from autotune.pipelines import Unsupported
from autotune.pipelines.kind import SCRIPT_PREFIX as PREFIX, kind_of
from autotune.pipelines.own_loop import OwnLoopJob
from autotune.pipelines.script import fusion
from autotune.pipelines.script.modules import local_modules
from autotune.pipelines.script.source import (
    API_MODULE,
    LINEAR_RULE,
    SQRT_RULE,
    Uses,
    scan,
)

LOADER_KNOBS = knobs.loader.NAMES
# The knobs a job's own run may set away from autotune's defaults, as trial 0 records them in effect: its
# loaders' arguments (a script's `-j 2`) and its batch (its own 12): what a trial is shown against.
OWN_RUN = (*LOADER_KNOBS, "batch_size")
# Why a trial keeps a DataLoader's own arguments when it loads an IterableDataset: the stream is yielded
# whole in every worker unless the dataset shards itself, so more workers would change what it trains on.
ITERABLE_KEPT = "an IterableDataset: the script's own workers"
# Knob -> the at.* call that routes it (the knob list's ROUTE).
COOPERATIVE = {k.NAME: k.ROUTE for k in knobs.MODEL if k.ROUTE}
# The lr rule for a script whose optimizers are in neither family (source.py), or in both: said.
DEFAULT_RULE = "sqrt"
# What no script takes yet, with why.
BATCH_WHY = (
    "the script builds its batches without a torch DataLoader: hand its batch over with at.batch_size() "
    "(autotune.script) to search it"
)
# The knobs the model seams apply to an unedited script (trial/loop/script/model.py), where no at.* call routes
# them: the knob list's model knobs.
UNEDITED = knobs.MODEL_NAMES
# A script that sets up no process group: the trial sets it up and replicates its model (DDP) with no edit,
# sharding its DataLoaders (trial/loop/script/ranks.py); FSDP would shard the model its own code builds.
NO_GROUP = {
    k: "the script sets up no process group: autotune runs its model data-parallel (DDP, torch's replicate) "
    "with no edit; FSDP needs the script to shard its own model"
    for k in (LEADS["fsdp"], *dependents("fsdp"))
}
NO_SHARDING = (
    "the script sets up no process group and builds its batches without a torch DataLoader: with no sampler to "
    "shard, every rank would train on the same batches: set up its process group and shard its data in it"
)
# A script that sets up its own process group wraps its own model too: DDP or FSDP is its choice.
OWN_STRATEGY = {
    k: "the script sets up its own process group and wraps its own model: how it replicates or shards is its own"
    for k in (LEADS["fsdp"], *dependents("fsdp"))
}
# Why the loader knobs stay out: before trial 0, a guess from the source, which the run's record replaces.
NO_LOADER = "the script builds no torch DataLoader (none in its source; trial 0's run shows one built anywhere)"
NO_LOADER_RAN = "the script builds no torch DataLoader (its run built none)"


def parse(spec: str) -> tuple[str, list[str]]:
    """'script:train.py --epochs 1' -> ('train.py', ['--epochs', '1'])."""
    try:
        words = shlex.split(spec[len(PREFIX) :])
    except ValueError as e:
        raise PipelineError(f"--pipeline {spec!r}: cannot split its arguments ({e})") from None
    if not words:
        raise PipelineError(f"--pipeline {spec!r}: expected 'script:PATH [ARGS...]'")
    return words[0], words[1:]


def spec_of(path: str, args: list[str] | tuple[str, ...] = ()) -> str:
    """The spec for a script and its arguments, the path made absolute and the file checked."""
    resolved = Path(path).expanduser().resolve()
    check_source(str(resolved), f"script {path!r}")
    return PREFIX + shlex.join([str(resolved), *args])


def normalize(spec: str) -> str:
    """A spec as the user wrote it, with its script's path made absolute (checked: exit 2 if bad)."""
    path, args = parse(spec)
    return spec_of(path, args)


def check_source(path: str, what: str) -> ast.Module:
    """The script's syntax tree; a missing, unreadable or unparsable file is bad input, in one line."""
    try:
        source = Path(path).read_text()
    except FileNotFoundError:
        raise PipelineError(f"{what}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PipelineError(f"{what}: cannot read it ({e})") from None
    try:
        compile(source, path, "exec")
        return ast.parse(source, path)
    except (SyntaxError, ValueError) as e:
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise PipelineError(f"{what} is not valid Python{where}: {getattr(e, 'msg', e)}") from None


def scan_script(path: str, args: list[str] | tuple[str, ...] = ()) -> Uses:
    """`scan` of the script at `path`, with the DataLoaders and optimizers of the modules it imports from its
    own folder (modules.py): where it builds them is the script's choice, what it routes is the same."""
    tree = check_source(path, f"script {path!r}")
    uses = scan(tree, args)
    modules = [scan(module) for _, module in local_modules(Path(path), tree)]
    optimizers = dict.fromkeys([*uses.optimizers, *(o for m in modules for o in m.optimizers)])
    return dataclasses.replace(
        uses, dataloader=uses.dataloader or any(m.dataloader for m in modules), optimizers=tuple(optimizers)
    )


def as_shown(uses: Uses, shown: Mapping[str, Any] | None) -> Uses:
    """The source's reading with what a run showed in its place (TrialConfig.shown, trial 0's record): the
    DataLoaders it built wherever it built them (a library's factory, a subclass), the optimizers that
    stepped, whether a process group existed when its model first ran, whether it seeded torch. The source
    stays the first guess, and the diff's map of where to edit."""
    if not shown:
        return uses
    changes: dict[str, Any] = {}
    if isinstance(loaders := shown.get("loaders"), int):
        changes["dataloader"] = loaders > 0
    if isinstance(stepped := shown.get("optimizers"), (tuple, list)) and stepped:
        changes["optimizers"] = tuple(str(o) for o in stepped)
    if isinstance(own_group := shown.get("own_group"), bool):
        changes["process_group"] = own_group
    if isinstance(seeded := shown.get("seeded"), bool):
        changes["seeded"] = seeded
    return dataclasses.replace(uses, **changes)


def lr_rule(uses: Uses) -> tuple[str, str]:
    """The lr rule for a changed global batch: the script's own where its lr reads the batch option its
    DataLoader reads (it scales its lr itself), else the one that fits the optimizer it constructs; and why."""
    if (own := option_lr_rule(uses)) is not None:
        flag = uses.own_value("loader_batch_option")
        return own, f"the script's lr reads its {flag}: it scales its lr with its batch itself, by the {own} rule"
    linear = [o for o in uses.optimizers if o in LINEAR_RULE]
    sqrt = [o for o in uses.optimizers if o in SQRT_RULE]
    if linear and not sqrt:
        return "linear", f"the script's optimizer is {', '.join(linear)}: linear, SGD's rule"
    if sqrt and not linear:
        adaptive = "the rule for adaptive optimizers (the Adam family, Adagrad, Adadelta, RMSprop)"
        return "sqrt", f"the script's optimizer is {', '.join(sqrt)}: sqrt, {adaptive}"
    if linear and sqrt:
        return DEFAULT_RULE, (
            f"the script constructs {', '.join(uses.optimizers)}, whose rules differ: {DEFAULT_RULE}, the default "
            "(give --lr-scaling for the one it runs)"
        )
    if not uses.optimizers:
        return DEFAULT_RULE, (
            f"the script's source names no optimizer autotune knows: {DEFAULT_RULE}, the default until trial 0 "
            "shows the one that steps (or give --lr-scaling)"
        )
    other = ", ".join(uses.optimizers)
    return (
        DEFAULT_RULE,
        f"the script's optimizer is {other}, with no known rule: {DEFAULT_RULE}, the default (or give --lr-scaling)",
    )


def option_lr_rule(uses: Uses) -> str | None:
    """The rule the script's own lr follows the batch option its DataLoader reads by ("linear", "sqrt"), where
    the trial hands its batch over through that option; None where it reads no such option, or not so."""
    rule = uses.own_value("lr_batch_rule")
    return rule if through_loader(uses) and rule in ("linear", "sqrt") else None


def rule_of(optimizer: str) -> str | None:
    """The rule for one optimizer class, None when neither family's."""
    return "linear" if optimizer in LINEAR_RULE else "sqrt" if optimizer in SQRT_RULE else None


# What to write when the script's own batch cannot be read (at.batch_size()'s default, its DataLoader's batch_size),
# before trial 0 has reported it.
READ_AT_RUN_TIME = (
    "at.batch_size()'s default cannot be read from the source ({why}): in a search, trial 0 runs the script as "
    "written and reports the value the script hands it (after its configurator or config file), and batch_size "
    "is searched from then on; to search it from the start, pass --baseline '{{\"batch_size\": N}}' with the "
    "batch the script runs (a single `autotune trial` has no trial 0: leave batch_size out of its config), or, "
    "where nothing overrides it, give the default as a number, a name assigned once or an argparse option "
    "with a literal default (`batch_size = at.batch_size(12)`)"
)
LOADER_READ_AT_RUN_TIME = (
    "its DataLoader's batch_size cannot be read from the source ({why}): in a search, trial 0 runs the script "
    "as written and reports the batch its loaders deliver, and batch_size is searched from then on; to search "
    "it from the start, pass --baseline '{{\"batch_size\": N}}' with the batch the script runs"
)


def own_batch(uses: Uses, global_batch: int | None, recorded: int | None = None) -> int | str:
    """The script's own micro-batch (batch_size is then searchable), or why batch_size stays fixed: handed
    over by at.batch_size(), else its DataLoader's (through_loader). recorded: the study's baseline batch
    (trial 0's report, or --baseline), the script's own where its source cannot say (a configurator, a
    config file, a name assigned twice)."""
    batch, accum = uses.own_value("batch_size"), uses.own_value("accumulation")
    read_at = READ_AT_RUN_TIME
    if batch is None:
        if not uses.dataloader:
            return BATCH_WHY
        batch, read_at = uses.own_value("loader_batch_size"), LOADER_READ_AT_RUN_TIME
        if batch is None:
            batch = "it is built outside the script's own file"
    if isinstance(batch, str) and recorded is not None:
        batch = recorded
    if isinstance(batch, str):
        return read_at.format(why=batch)
    if isinstance(accum, str) and global_batch is not None:  # else its runtime default sets the lr's scale
        return (
            f"at.accumulation()'s default cannot be read from the source ({accum}), and the study fixes "
            "--global-batch: give it as a number, a name assigned once or an argparse option with a literal default"
        )
    return batch


# A command-line option that may set a script's batch (nanoGPT's configurator: `--batch_size=12`).
BATCH_FLAGS = ("--batch_size", "--batch-size", "--bs", "-b")


def batch_flag(args: list[str] | tuple[str, ...]) -> tuple[str, int] | None:
    """The script's own batch option as its arguments give it, and its value: ("--batch_size=", 12) for the
    joined form, ("--batch-size", 12) for the spaced one (the last given wins, as in argparse); None."""
    found = None
    for i, word in enumerate(args):
        flag, joined, value = word.partition("=")
        if flag in BATCH_FLAGS and joined and value.isdigit():
            found = (flag + "=", int(value))
        elif word in BATCH_FLAGS and i + 1 < len(args) and args[i + 1].isdigit():
            found = (word, int(args[i + 1]))
    return found


def through_loader(uses: Uses) -> bool:
    """The trial hands the batch over through the script's DataLoaders (it calls no at.batch_size())."""
    return uses.own_value("batch_size") is None and uses.dataloader


NOT_REPRODUCIBLE = (
    "the script never seeds torch (no torch.manual_seed call in its source or its run), so no two "
    "runs start from the same weights and its loss trajectory cannot be compared with the baseline's"
)


def not_checkable(cfg: TrialConfig) -> str | None:
    """Why parity and time to target cannot judge a config's runs, or None: a script that never seeds torch
    cannot reproduce a run. Not a script: None."""
    return None if kind_of(cfg.pipeline).loop != "script" or load(cfg).uses.seeded else NOT_REPRODUCIBLE


def unsupported(
    uses: Uses, global_batch: int | None = None, recorded: int | None = None, ran: bool = False
) -> dict[str, str]:
    """Knob -> why the script cannot take it, from what its source routes (recorded: own_batch's), and what
    its run showed where one has (`ran`: as_shown's)."""
    out = dict(OWN_STRATEGY if uses.process_group else NO_GROUP)
    if not uses.process_group and not uses.dataloader:
        out["gpus"] = NO_SHARDING
    if isinstance(why := own_batch(uses, global_batch, recorded), str):
        out["batch_size"] = why
    elif (
        through_loader(uses)
        and isinstance(form := uses.own_value("lr_batch_rule"), str)
        and option_lr_rule(uses) is None
    ):
        flag = uses.own_value("loader_batch_option")
        out["batch_size"] = (
            f"its lr reads {flag}, which its DataLoader's batch_size is, {form}: a trial at another batch could not "
            "tell its own lr from the study's rule (the two would scale it twice); write the lr as a product with "
            "the batch or its square root (lr = base * args.batch_size / 256)"
        )
    if fused := fusion.unroutable(uses.optimizers):
        out["optimizer_fusion"] = fused
    if not uses.dataloader:
        out |= {k: NO_LOADER_RAN if ran else NO_LOADER for k in LOADER_KNOBS}
    for knob, call in COOPERATIVE.items():
        if call not in uses.api and knob not in UNEDITED:
            out[knob] = f"the script never calls at.{call}() ({API_MODULE})"
    for name, own in own_values(uses).items():
        if name not in out and (why := knobs.BY_NAME[name].script_why(own, uses.api)):
            out[name] = why
    return out


def routed_to_model(uses: Uses, unsupported: Collection[str]) -> frozenset[str]:
    """The knobs an unedited script takes through the model its optimizer trains: those it takes, where it
    makes no at.* call that routes them itself."""
    return frozenset(k for k in UNEDITED if k not in unsupported and COOPERATIVE.get(k) not in uses.api)


def own_values(uses: Uses) -> dict[str, str]:
    """Each knob's value the script runs alone, where it gives that knob's at.* call one (each knob's
    `script_own`: at.autocast()'s argument, fp32 when it gives none), or why it cannot be read."""
    return {k.NAME: k.script_own(uses.own_value(k.NAME)) for k in knobs.ALL if hasattr(k, "script_own")}


def refused_values(uses: Uses) -> dict[str, dict[Any, str]]:
    """Knob -> {value the script cannot take: why}, for knobs it takes otherwise (each knob's
    `script_refused`: fp16 without a GradScaler handed over, apex's optimizer in place of its own)."""
    own = own_values(uses)
    refused = {k.NAME: k.script_refused(own.get(k.NAME), uses.api) for k in knobs.ALL if hasattr(k, "script_refused")}
    return {name: values for name, values in refused.items() if values}


class ScriptJob(OwnLoopJob):
    """A checked script: its path and arguments, what it routes, and the knobs it cannot take."""

    def __init__(
        self,
        spec: str,
        path: str,
        args: list[str],
        uses: Uses,
        global_batch: int | None = None,
        recorded: int | None = None,
        recorded_accumulation: int = 1,
        ran: bool = False,
    ) -> None:
        """recorded: the study's baseline batch_size, the script's own where its source cannot say which
        (trial 0 reported the value at.batch_size() was handed, or --baseline gave it); recorded_accumulation:
        the micro-batches per step trial 0 saw it accumulate, where no at.accumulation() default says; ran:
        `uses` holds what a run showed (as_shown), not only the source's guess."""
        super().__init__(spec, unsupported(uses, global_batch, recorded, ran))
        self.unsupported = Unsupported(self.unsupported.why, refused_values(uses))
        self.path, self.args, self.uses = path, list(args), uses
        # What the model seams apply (trial/loop/script/model.py): the knobs it takes that no at.* call routes.
        self.routed = routed_to_model(uses, self.unsupported)
        # Its repeated blocks are found when its model is first called: none known before (stage_count).
        self.stages = None if "checkpoint_segments" in self.routed else ()
        self.recorded = recorded
        self.through_loader = through_loader(uses)
        read = uses.own_value("loader_batch_size" if self.through_loader else "batch_size")
        self.read_at_run_time = isinstance(read, str) and recorded is None
        batch = own_batch(uses, global_batch, recorded)
        # The script's own (micro-batch, accumulation) when it hands its batch over; None: it keeps its own.
        self.own: tuple[int, int] | None = None
        if isinstance(batch, int):
            accum = uses.own_value("accumulation")
            self.own = (batch, accum if isinstance(accum, int) else recorded_accumulation)
        self.lr_rule, self.lr_rule_why = lr_rule(uses)
        # The rule its own lr follows the batch option its DataLoader reads by, where the trial hands its batch
        # over through that option (option_lr_rule); None: its lr does not follow the option it is handed.
        self.option_rule = option_lr_rule(uses)
        # With no DataLoader and no at.batch_size(): where trial 0's model was fed the batch its own option gives
        # (a configurator's `--batch_size=12`), the trial hands its batch over through that option (the run
        # checks that the batch moved: running.py).
        self.batch_option: str | None = None
        flag = batch_flag(args)
        if self.unsupported.why.get("batch_size") == BATCH_WHY and flag is not None and recorded == flag[1]:
            self.batch_option, self.own = flag[0], (flag[1], recorded_accumulation)
            why = {k: v for k, v in self.unsupported.why.items() if k != "batch_size"}
            self.unsupported = Unsupported(why, self.unsupported.values)
        # What only the source's guess keeps out, before any run has shown the script: a trial given one of
        # these lets its run decide (the loader seams apply to any DataLoader built; ranks.py refuses gpus
        # with nothing to shard), where a study drops them until trial 0 shows otherwise.
        guesses = () if ran else (NO_LOADER, NO_SHARDING)
        self.guessed = frozenset(k for k, why in self.unsupported.why.items() if why in guesses)

    def refused(self) -> Unsupported:
        """What a trial refuses up front (exit 5): the unsupported knobs, less those its run decides (guessed)."""
        keep = {k: why for k, why in self.unsupported.why.items() if k not in self.guessed}
        return Unsupported(keep, self.unsupported.values)

    def own_baseline(self, global_batch: int | None = None) -> dict[str, Any]:
        """The script run as written: the batch it hands to at.batch_size(), where it hands one over (its
        accumulation was read against the study's global batch when the job was loaded), and each knob's own
        value given to its at.* call when not the default (own_values), so trial 0's config says what the user
        ran."""
        own: dict[str, Any] = {} if self.own is None else {"batch_size": self.own[0]}
        if global_batch and self.own and self.uses.own_value("accumulation") is None and prod(self.own) != global_batch:
            own = {}  # it keeps its own accumulation: the baseline runs the one micro-batch that keeps the global batch
        if self.own is None and isinstance(kept := self.kept_batch(), int):
            own["batch_size"] = kept  # not searched: the batch it runs, so the records say it
        for name, value in own_values(self.uses).items():  # at.autocast()'s own dtype, where not fp32
            if name not in self.unsupported and value != knobs.BY_NAME[name].ROW.default:
                own[name] = value
        return own

    def kept_batch(self) -> int | None:
        """The batch a script that keeps its own runs (no at.batch_size()): its DataLoader's batch_size as the
        source reads it, else as trial 0's loaders delivered it (recorded); None when it hands its batch over,
        or nothing says."""
        if self.uses.own_value("batch_size") is not None:
            return None
        loader = self.uses.own_value("loader_batch_size")
        return loader if isinstance(loader, int) else self.recorded

    def not_built(self) -> str:
        return (
            f"--pipeline {self.spec!r} is your own script, run whole: it has no model or dataset to build "
            "apart (for `autotune train` or the memory probe); run it with the exported changes "
            "(autotune export --format script)"
        )


def load(cfg: TrialConfig) -> ScriptJob:
    path, args = parse(cfg.pipeline)
    if not Path(path).is_absolute():
        path = str(Path(path).resolve())
    recorded = dict(cfg.baseline or ()).get("batch_size")
    uses = as_shown(scan_script(path, args), dict(cfg.shown or ()))
    return ScriptJob(
        cfg.pipeline,
        path,
        args,
        uses,
        cfg.global_batch,
        recorded if isinstance(recorded, int) else None,
        cfg.own_accumulation,
        bool(cfg.shown),
    )


def study_defaults(spec: str, global_batch: int | None, given: Collection[str] = ()) -> dict[str, Any]:
    """The workload fields a script's source sets when the user gave none (`given` names those they did):
    `lr_scaling`, the rule its optimizer follows (lr_rule), and `lr`, its own (read from at.lr() or its
    optimizer's constructor), which is meant for its own global batch: under a study's --global-batch
    it is scaled to that batch, the batch TrialConfig.lr is given for. Without --global-batch, the
    accumulation at.accumulation()'s default reads (`own_accumulation`): every trial keeps it. With one,
    whether the script keeps its own accumulation (`keeps_accumulation`: it hands its batch over but calls
    no at.accumulation()), so the batch seam divides the global batch over the ranks."""
    path, args = parse(spec)
    uses = scan_script(path, args)
    job = ScriptJob(spec, path, args, uses, global_batch)
    rule = lr_rule(uses)[0] if "lr_scaling" not in given else None
    out: dict[str, Any] = {} if rule is None else {"lr_scaling": rule}
    if "own_accumulation" not in given and not global_batch and job.own is not None and job.own[1] != 1:
        out["own_accumulation"] = job.own[1]
    if "keeps_accumulation" not in given and global_batch and job.own is not None:
        out["keeps_accumulation"] = uses.own_value("accumulation") is None
    lr = uses.own_value("lr")
    if "lr" not in given and isinstance(lr, float) and lr > 0:
        if global_batch and job.own is not None:
            lr *= lr_factor(global_batch / (job.own[0] * job.own[1]), rule or TrialConfig().lr_scaling)
        out["lr"] = lr
    return out
