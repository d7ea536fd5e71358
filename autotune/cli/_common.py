"""What the commands share: the argparse parser that exits 2, and the workload flags."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from autotune.core.errors import ConfigError, ExitCode
from autotune.core.files import folder_problem
from autotune.pipelines import skip_bad_data_in_trials
from autotune.trial.processes import placement as where
from autotune.trial.processes.placement import LAUNCHERS


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own usage errors are bad input too: exit 2, one line
        self.exit(ExitCode.BAD_INPUT, f"autotune: error: {message} (see `{self.prog} --help`)\n")


def workload_args(p: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """--data, --image-size, --pipeline. `inherited`: the defaults come from a config file."""
    p.add_argument(
        "--data",
        metavar="DIR",
        help="dataset folder, passed to the pipeline as data_dir: the unet "
        "reads DIR/images and DIR/masks (default: "
        + ("the config's)" if inherited else "a synthetic set generated once under studies/data)"),
    )
    p.add_argument(
        "--image-size",
        type=int,
        default=None,
        metavar="PX",
        help="training crop size (default: " + ("the config's)" if inherited else "128)"),
    )
    p.add_argument(
        "--pipeline",
        default=None,
        metavar="MODULE:FACTORY",
        help="training pipeline: 'unet', an importable factory returning a Pipeline, "
        "'lightning:MODULE:FACTORY' (returns a LightningModule and a LightningDataModule, trained by "
        "Lightning's Trainer) or 'hf:MODULE:FACTORY' (returns the model, train dataset, data collator "
        "and base TrainingArguments, trained by the Hugging Face Trainer) (default: "
        + ("the config's)" if inherited else "unet)"),
    )


def study_args(p: argparse.ArgumentParser, *, studies_dir: str | None = None) -> None:
    """--study and --storage for commands that read an existing study."""
    p.add_argument("--study", default="autotune", help="study name (default autotune)")
    p.add_argument("--storage", default=None, help="Optuna storage (default: the studies.db journal)")
    if studies_dir:
        p.add_argument("--studies-dir", default="studies", help=studies_dir)


def check_folder(what: str, path: str | os.PathLike[str]) -> None:
    """The folder `what` names (e.g. "--studies-dir x") must be one or be makeable, else bad input: one
    line, before anything is written (a search makes its default data under --studies-dir first)."""
    problem = folder_problem(path)
    if problem:
        raise ConfigError(f"{what}: {problem}")


def check_journal(storage: str | None) -> None:
    """A journal --storage (a path, not a URL) must be a file in a folder that is or can be made."""
    if storage is None or "://" in storage:
        return
    problem = folder_problem(Path(storage).parent)
    try:
        if problem is None and Path(storage).is_dir():
            problem = f"a folder; name the journal file in it (e.g. {Path(storage) / 'studies.db'})"
    except OSError as e:  # a name too long, no permission to look
        problem = e.strerror or str(e)
    if problem:
        raise ConfigError(f"--storage {storage}: {problem}")


def skip_bad_data_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--skip-bad-data",
        action="store_true",
        help="leave out data items that cannot be decoded (and say how many) instead of refusing the data (exit 2)",
    )


def apply_skip_bad_data(args: argparse.Namespace) -> None:
    """`trial` and `train`: their processes read it when they build their data (a search's session
    passes it to its trials itself, from its settings)."""
    if getattr(args, "skip_bad_data", False):
        skip_bad_data_in_trials()


def cpus_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cpus",
        default=None,
        metavar="LIST",
        help="run this process, its trials and their data loaders on these CPUs only (a Linux CPU list "
        "such as 0-7 or 0-3,8-11): on a machine shared by one worker per GPU, give each its own "
        "share, so loader workers and threads are sized by it and a neighbour's steady use is "
        "not counted as contention",
    )


def apply_cpus(args: argparse.Namespace) -> None:
    """Pin to --cpus before anything starts (the warm server and every trial inherit the affinity)."""
    if getattr(args, "cpus", None) is None:
        return
    try:
        cpus = parse_cpu_list(args.cpus)
    except ValueError:
        raise ConfigError(f"--cpus {args.cpus!r}: not a CPU list (e.g. 0-7 or 0-3,8-11)") from None
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ConfigError(
            f"--cpus {args.cpus}: CPU(s) {format_cpu_list(cpus - allowed)} are not available to this "
            f"process (it may use {format_cpu_list(allowed)})"
        )
    os.sched_setaffinity(0, cpus)


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}; ValueError for anything else (an empty list, a reversed range)."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        a, b = int(lo), int(hi if dash else lo)  # "0-" is no range: int("") raises
        if a < 0 or b < a:
            raise ValueError(text)
        cpus.update(range(a, b + 1))
    return cpus


def format_cpu_list(cpus: set[int]) -> str:
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def new_console() -> Any:
    """rich's Console; wide when the output is not a terminal (a log file, a pipe, CI), where rich would
    otherwise fold every table into 80 columns and cut the training-math and config cells to one letter."""
    from rich.console import Console  # lazy: rich, not loaded for `autotune --help`

    return Console() if sys.stdout.isatty() else Console(width=200)


def nodes_args(p: argparse.ArgumentParser) -> None:
    """--nodes, --launcher, --scheduler, --scheduler-arg: where a trial's ranks run (trial/processes/nodes.py)."""
    p.add_argument(
        "--nodes",
        default="1",
        metavar="N",
        help="nodes every trial spans, with its gpus ranks on each (default 1: this machine only); "
        "more needs --launcher torchx",
    )
    p.add_argument(
        "--launcher",
        default="single-machine",
        choices=LAUNCHERS,
        help="what starts the ranks: single-machine (torchrun --standalone, the default) or torchx "
        "(torchrun on every node with the c10d rendezvous; pip install 'autotune[multinode]')",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="NAME",
        help="the launcher's scheduler: local_cwd (nodes simulated on this machine), slurm, kubernetes, ...",
    )
    p.add_argument(
        "--scheduler-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the scheduler's run options (e.g. partition=gpu for slurm, queue=default for "
        "kubernetes), or a node setting: image=IMAGE (needed where nodes run a container image), cpu=N, "
        "memMB=N (per node); repeatable",
    )


def apply_nodes(args: argparse.Namespace) -> None:
    """Check the placement (exit 2, one line, nothing written) and hand it to every trial this process
    starts, through the environment."""
    from autotune.trial.processes import nodes  # lazy: torchx_nodes, ~20 ms of start-up `--help` skips

    placement = where.parse(args.nodes, args.launcher, args.scheduler, args.scheduler_arg)
    if placement.nodes > 1 and getattr(args, "global_batch", None):
        # TrialConfig derives the accumulation from gpus alone: on N nodes the step would take N x the samples.
        raise ConfigError(f"--global-batch with --nodes {placement.nodes} is not supported yet")
    nodes.check(placement)
    os.environ.update(placement.to_env())
