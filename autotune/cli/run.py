"""`trial`, `train` and `make-data`: run one config (measured, or for real epochs), or write data."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from autotune.cli._common import (
    apply_nodes,
    apply_skip_bad_data,
    check_folder,
    new_console,
    nodes_args,
    skip_bad_data_arg,
    workload_args,
)
from autotune.apply.run import config_for, measured_loaders, run
from autotune.core import errors
from autotune.core.configfile import load_config
from autotune.core.errors import AutotuneError, ExitCode
from autotune.core.outcomes import Reason
from autotune.pipelines import base_config
from autotune.trial.loop.outcome import status_of
from autotune.trial.loop.worker import unit_said


def register(sub: Any) -> None:
    t = sub.add_parser(
        "trial",
        help="run one measured trial of a config",
        description="Run one trial in its own process group (under torchrun when gpus > 1) and "
        "write its result JSON. Exit codes: 0 ok, 2 bad config or undecodable data (named), 3 out of "
        "memory, 4 non-finite loss, 5 knob unsupported here, 1 crash.",
    )
    t.add_argument("--config", required=True, help="YAML/JSON TrialConfig, or an exported best.yaml as it is")
    t.add_argument("--out", default=None, help="result JSON (default: <config dir>/trial/result.json)")
    t.add_argument("--timeout", type=float, default=900.0, help="seconds before the trial is killed (default 900)")
    t.add_argument(
        "--profile", action="store_true", help="write a torch.profiler summary (profile.txt) next to the result"
    )
    t.add_argument("--steps", type=int, default=None, help="timed steps (default: the config's)")
    t.add_argument("--seconds", type=float, default=None, help="measure for this long instead of a step count")
    skip_bad_data_arg(t)
    nodes_args(t)
    workload_args(t, inherited=True)
    t.set_defaults(func=cmd_trial)

    p = sub.add_parser(
        "train",
        help="train for real with a config (optionally against the baseline)",
        description="Train the pipeline with a config for full epochs: every knob applied as in a trial, a "
        "progress bar, and per epoch the wall time, samples/s (device synchronized before each clock read, "
        "data loading included, validation excluded), mean loss and validation IoU (the pipeline's metric on "
        "its held-out set, in fp32; skipped with a note if the pipeline has none). Each run trains in a "
        "fresh process, as a training script would (gpus>1: under `torchrun --standalone --nproc-per-node N`, "
        "DDP, rank 0 reporting and validating). At the end the weights (as the pipeline's build_model() "
        "names them) and the config are saved to --out/config.pt (and baseline.pt), and all figures to "
        "--out/train.json. --compare-baseline then trains the plain-PyTorch baseline (default knobs, same "
        "workload) for the same epochs, in --rounds paired rounds (the two sides alternated), and prints "
        "the speedup (each round's, their median and range) and both final IoUs with their difference. "
        "Exit codes: 0 ok, 2 bad input, 3 out of memory, 4 non-finite loss, 1 crash.",
    )
    p.add_argument("--config", required=True, help="YAML/JSON config, e.g. an exported best.yaml")
    p.add_argument("--epochs", type=int, default=10, help="full passes over the training set (default 10)")
    p.add_argument(
        "--compare-baseline",
        action="store_true",
        help="also train the baseline config for the same epochs and compare speed and IoU",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        metavar="N",
        help="with --compare-baseline: N paired rounds, the two sides alternated, each run a fresh process; "
        "the speedup is the rounds' median, with the sign test's interval for it: faster only from 3 rounds with "
        "an interval clear of x1.00, else no measurable gain (default 3; 1: one pair, a single draw). Each round "
        "trains both sides",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="checkpoints and train.json (default studies/train/<timestamp>)"
    )
    skip_bad_data_arg(p)
    workload_args(p, inherited=True)
    p.set_defaults(func=cmd_train)

    r = sub.add_parser(
        "run",
        help="train your script to its end with a script study's best.yaml applied as it was measured",
        description="Run your training script as `python SCRIPT ARGS` would, to its own end (its epochs: no "
        "timed stop, no step limit), with best.yaml applied through the same seams the study's trials used "
        "(the DataLoader's and optimizer's arguments, zero_grad, cudnn, threads, and what the at.* calls hand "
        "over), and no edit to the script: what runs is what was measured, including the knobs the diff "
        "cannot write. It says first which knobs it applies (those best.yaml changes from the script's own). "
        "The trial's window is measured on the way, in the study's unit, and the `applied` record a trial writes "
        "(each knob asked for beside the one in effect) goes to --out, after Ctrl-C too. A config on several "
        "GPUs runs under torchrun: torchrun --nproc-per-node N -m autotune run --config best.yaml SCRIPT ARGS. "
        "Exit codes: the script's own; 2 bad input (one line), 3 out of memory, 4 non-finite loss, 5 knob "
        "unsupported, 130 interrupted.",
    )
    r.add_argument("--config", required=True, help="a script study's best.yaml (autotune search --script ...)")
    r.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="the JSON of what was applied and measured (default: <config dir>/run/applied.json)",
    )
    r.add_argument("script", help="your training script: the study's, or one that takes the same knobs")
    r.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments, as you pass them to python")
    r.set_defaults(func=cmd_run)

    m = sub.add_parser(
        "make-data",
        help="write a synthetic person-segmentation dataset",
        description="Write JPEG photos with person-like figures and PNG masks; deterministic per seed.",
    )
    m.add_argument("dir", help="output folder (must not exist or be empty)")
    m.add_argument("--n", type=int, default=256, help="number of images (default 256)")
    m.add_argument("--size", default="640x480", help="source image size WxH (default 640x480)")
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=cmd_make_data)


def _config(args: argparse.Namespace, **extra: Any) -> Any:
    """The config file, with the command line's workload flags over it."""
    cfg = {**load_config(args.config).to_dict(), **extra}
    return base_config(args.pipeline, args.image_size, args.data, "studies", **cfg)


def cmd_trial(args: argparse.Namespace) -> int:
    from autotune.trial.processes import launcher  # lazy: psutil and torchx_nodes, not for `autotune --help`

    extra: dict[str, Any] = {}
    if args.steps:
        extra["timed_steps"] = args.steps
    if args.seconds:
        extra["seconds"] = args.seconds
    if args.profile:
        extra["profile"] = True
    out = Path(args.out) if args.out else Path(args.config).resolve().parent / "trial" / "result.json"
    check_folder(f"--out {out}", out.parent)
    apply_nodes(args)
    cfg = _config(args, **extra)
    apply_skip_bad_data(args)
    trial_dir = out.parent
    try:
        result = launcher.run_trial(cfg, trial_dir, args.timeout)
    except errors.TrialFailure as e:
        print(f"autotune trial: {e.reason}: {e}", file=sys.stderr)
        if e.log_tail and e.reason in (Reason.CRASH, Reason.COMM, Reason.TIMEOUT):
            print(e.log_tail, file=sys.stderr)
        return errors.exit_code_for(e.reason)
    if out != trial_dir / "result.json":
        os.replace(trial_dir / "result.json", out)
    print(
        f"autotune trial: {result.samples_per_s:.2f} {unit_said(result.applied)}  step p50 {(result.step_time_p50 or 0) * 1e3:.0f} ms "
        f"p90 {(result.step_time_p90 or 0) * 1e3:.0f} ms  data wait {result.data_wait_fraction:.0%}  "
        f"peak {(result.peak_memory_bytes or 0) / 2**20:.0f} MiB  startup {result.startup_s:.1f} s  -> {out}"
    )
    return ExitCode.OK


def cmd_train(args: argparse.Namespace) -> int:
    from autotune.apply.train import TrainFailed, train  # lazy: torch, not loaded for `autotune --help`

    if args.epochs < 1:
        raise AutotuneError(f"--epochs must be >= 1, got {args.epochs}")
    if args.rounds < 1:
        raise AutotuneError(f"--rounds must be >= 1, got {args.rounds}")
    out = Path(args.out) if args.out else Path("studies") / "train" / time.strftime("%Y%m%d-%H%M%S")
    check_folder(f"--out {out}", out)
    apply_skip_bad_data(args)
    console = new_console()
    try:
        train(
            _config(args),
            args.epochs,
            out,
            args.compare_baseline,
            lambda s: console.print(s, highlight=False, markup=False, soft_wrap=True),
            rounds=args.rounds,
        )
    except TrainFailed as e:
        print(f"autotune train: {e}", file=sys.stderr)
        return e.code
    return ExitCode.OK


def cmd_run(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(args.config).resolve().parent / "run" / "applied.json"
    check_folder(f"--out {out}", out.parent)
    cfg, note = config_for(args.config, args.script, args.args)
    if note:
        print(f"autotune run: {note}", file=sys.stderr)
    try:
        # The loaders the exported trial iterated, where the script run is the one it measured.
        measured = measured_loaders(args.config) if note is None else None
        return run(cfg, out, lambda s: print(s, file=sys.stderr), measured, Path(args.config).name)
    except errors.AutotuneError:
        raise
    except Exception as e:  # a failure a trial names (out of memory, a non-finite loss): its exit code
        status, message = status_of(e)
        if status not in (Reason.OOM, Reason.NUMERICS, Reason.UNSUPPORTED, Reason.DATA):
            raise  # the script's own failure: its traceback, as `python` shows it
        print(f"autotune run: {status}: {message}", file=sys.stderr)
        return errors.exit_code_for(status)


def cmd_make_data(args: argparse.Namespace) -> int:
    from autotune.pipelines.unet.data import make_data, parse_size  # lazy: numpy and PIL, not for `autotune --help`

    check_folder(args.dir, args.dir)
    path = make_data(args.dir, args.n, parse_size(args.size), args.seed)
    print(f"autotune: wrote {args.n} images and masks to {path}")
    return ExitCode.OK
