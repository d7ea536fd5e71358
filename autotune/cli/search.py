"""`search` and `worker`: start a study, or join one, and run its trials."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from autotune.cli._common import (
    apply_cpus,
    apply_nodes,
    check_folder,
    check_journal,
    cpus_arg,
    new_console,
    nodes_args,
    skip_bad_data_arg,
    workload_args,
)
from autotune.apply.export.patched import patched_copy
from autotune.core.config import LR_RULES, TrialConfig, whole_batch
from autotune.core.configfile import load_baseline
from autotune.core.errors import AutotuneError, ConfigError
from autotune.core.settings import SAMPLERS, SearchSettings, parse_duration, parse_percent
from autotune.core.outcomes import Verdict
from autotune.pipelines import base_config, kind_of, script
from autotune.search.budget import Budget
from autotune.search.space.reading import load_space
from autotune.search.store.storage import shown_storage

LARGE_DATA = 200  # items: below this the up-front data check takes a moment and needs no bar


def register(sub: Any) -> None:
    s = sub.add_parser(
        "search",
        help="search the knobs jointly with Optuna within a time budget",
        description="Run a budgeted Optuna search. Trial 0 is the plain-PyTorch baseline, trial 1 "
        "the published guides' recommendation; every trial is a short measured run in its own "
        "process. Results go to an Optuna study (`optuna-dashboard studies.db`), the best config "
        "to studies/<study>/best.yaml. Re-running with the same --study resumes it; --budget then "
        "counts afresh for this run. Ctrl-C or SIGTERM stop the current trial, export the best so "
        "far and exit 130.",
    )
    s.add_argument(
        "--budget",
        default=None,
        help="wall time for this run: 2h, 90m, 1h30m, 45s or seconds (required unless --create-only)",
    )
    s.add_argument("--study", default="autotune", help="study name; an existing study is resumed (default autotune)")
    s.add_argument(
        "--storage",
        default=None,
        help="Optuna storage: a journal file path (default studies.db), "
        "sqlite:///x.db, postgresql://user:pass@host/db or grpc://host:port",
    )
    s.add_argument(
        "--space", default=None, metavar="FILE", help="search-space YAML (default search_spaces/default.yaml)"
    )
    s.add_argument(
        "--sampler",
        default="auto",
        choices=SAMPLERS,
        help="auto (default): one knob at a time from the best so far, interleaved with TPE; "
        "tpe|gp|random: that Optuna sampler alone, for comparison",
    )
    s.add_argument("--seed", type=int, default=None, help="sampler seed")
    s.add_argument(
        "--trial-timeout",
        default=None,
        help="kill a trial after this long; stored in the study for "
        "its workers (default: max(2m, budget/4), or 10m without a budget)",
    )
    s.add_argument(
        "--trial-seconds", type=float, default=15.0, help="measured seconds per trial, after warm-up (default 15)"
    )
    s.add_argument("--warmup-steps", type=int, default=3, help="untimed steps before measuring (default 3)")
    s.add_argument("--n-trials", type=int, default=None, help="stop after this many trials")
    s.add_argument("--force", action="store_true", help="resume a study recorded on different hardware/software")
    s.add_argument(
        "--cold-start",
        action="store_true",
        help="start every trial as a fresh interpreter instead of forking a warm one (slower start-up)",
    )
    s.add_argument(
        "--create-only",
        action="store_true",
        help="create the study (space, workload, fingerprint, baseline) and exit: workers then join it",
    )
    s.add_argument("--studies-dir", default="studies", help="where trial logs, artifacts and exports go")
    s.add_argument(
        "--confirm-rounds",
        type=int,
        default=3,
        metavar="N",
        help="re-measure the top configs and the baseline in N interleaved rounds before exporting "
        "(part of the budget is kept for it; 0: off; default 3)",
    )
    s.add_argument("--confirm-top", type=int, default=3, metavar="K", help="how many top configs (default 3)")
    s.add_argument(
        "--global-batch",
        type=int,
        default=None,
        metavar="N",
        help="samples per optimizer step, the same in every trial: batch_size becomes the micro-batch "
        "per process and gradient accumulation makes up the rest (default: free, the batch is searched)",
    )
    s.add_argument(
        "--baseline",
        default=None,
        metavar="FILE|JSON",
        help="the knobs you train with today, that every speedup is measured against: a best.yaml-style "
        'file or inline JSON such as \'{"num_workers": 4, "batch_size": 16}\' (default: plain '
        "PyTorch at batch 8, accumulating up to --global-batch); stored in the study",
    )
    s.add_argument(
        "--lr-scaling",
        default=None,
        choices=LR_RULES,
        help="how the learning rate follows a global batch that differs from the baseline's "
        "(default sqrt, the rule for Adam-family optimizers; for --script, the rule of the optimizer that "
        "stepped in trial 0: linear for SGD, sqrt for the Adam family; none)",
    )
    s.add_argument(
        "--parity-steps",
        type=int,
        default=30,
        metavar="K",
        help="before exporting, train the winner and the baseline K optimizer steps from the same "
        "weights on the same data and compare their losses; a winner that trains differently is "
        "skipped for the next best (0: off; default 30)",
    )
    s.add_argument(
        "--memory-headroom",
        default="10%",
        metavar="PCT",
        help="a config must leave this share of device memory free (RAM on CPU), measured from its "
        "peak; one that leaves less is infeasible and never exported (default 10%%)",
    )
    skip_bad_data_arg(s)
    cpus_arg(s)
    nodes_args(s)
    workload_args(s)
    s.add_argument(
        "--script",
        default=None,
        metavar="PATH",
        help="your own training script, run as written in each trial: the same as "
        "--pipeline 'script:PATH ARGS' (see docs/own-model.md)",
    )
    s.add_argument(
        "--script-args",
        default=None,
        metavar="ARGS",
        help='the script\'s own command-line arguments, one shell-quoted string (e.g. "--epochs 1 data/")',
    )
    s.set_defaults(func=cmd_search)

    w = sub.add_parser(
        "worker",
        help="join an existing study and run trials (many machines, one study)",
        description="Join a study created by `autotune search` (usually on PostgreSQL) and run its "
        "trials until --budget or --n-trials is spent. The space, workload, trial timeout and "
        "fingerprint come from the study; a machine whose fingerprint differs is refused. The study "
        "names the pipeline its trials import, so whoever can write the study chooses the code a worker "
        "runs: a worker runs only a pipeline its own --pipeline names (the built-in unet without it) and "
        "refuses any other study before importing anything of it.",
    )
    w.add_argument("--storage", required=True, help="the study's storage URL (postgresql://…, grpc://host:port, …)")
    w.add_argument("--study", required=True, help="study name")
    w.add_argument("--budget", default=None, help="wall time for this worker (2h, 90m, …)")
    w.add_argument("--n-trials", type=int, default=None, help="stop after this many trials")
    w.add_argument("--trial-timeout", default=None, help="kill a trial after this long (default: the study's)")
    w.add_argument(
        "--data", default=None, metavar="DIR", help="this machine's copy of the dataset, if not at the study's path"
    )
    w.add_argument(
        "--pipeline",
        action="append",
        default=None,
        metavar="MODULE:FACTORY",
        help="the pipeline this worker may run, as given to `autotune search --pipeline`; repeat it to "
        "allow several. A study naming any other is refused (exit 2) before it is imported "
        "(default: unet, the built-in one, only)",
    )
    w.add_argument("--studies-dir", default="studies", help="where trial logs and artifacts go")
    w.add_argument("--force", action="store_true", help="join although this machine's fingerprint differs")
    w.add_argument("--cold-start", action="store_true", help="start every trial as a fresh interpreter")
    skip_bad_data_arg(w)
    cpus_arg(w)
    nodes_args(w)
    w.set_defaults(func=cmd_worker)


def _console() -> Any:
    return new_console()


def cmd_search(args: argparse.Namespace) -> int:
    from autotune.search.loop.session import SearchSession  # lazy: optuna, psutil (--help starts without)

    settings = _search_settings(args)
    console = _console()
    with _data_progress(console) as progress:
        session = SearchSession.create(
            settings, warm=not args.cold_start, say=_dim(console), defer=args.create_only, progress=progress
        )
    if args.create_only:
        console.print(
            f"autotune: study {args.study!r} ready in {shown_storage(args.storage)}; the first worker "
            f"resolves its space on its own hardware. Join it with: autotune worker --storage URL "
            f"--study {args.study}",
            highlight=False,
        )
        return 0
    return _run(session, console)


def _search_settings(args: argparse.Namespace) -> Any:
    """`search`'s flags checked and resolved into SearchSettings. Every flag is read before the last step,
    which makes the default data on first use (under --studies-dir): bad input writes nothing."""

    if args.budget is None and not args.create_only:
        raise ConfigError("search needs --budget (e.g. --budget 10m)")
    if args.global_batch is not None and args.global_batch < 1:
        raise ConfigError(f"--global-batch must be a positive number of samples, got {args.global_batch}")
    check_folder(f"--studies-dir {args.studies_dir}", args.studies_dir)  # the default data goes there first
    check_journal(args.storage)
    apply_cpus(args)
    apply_nodes(args)
    shared = _shared_settings(args)
    headroom = parse_percent(args.memory_headroom, "--memory-headroom")
    if args.space is not None:  # its own file's errors (the session reads it again, against the hardware)
        load_space(args.space)
    batch = whole_batch(args.global_batch)
    baseline = load_baseline(args.baseline, TrialConfig(**batch)) if args.baseline is not None else None
    base = base_config(
        _pipeline_spec(args),
        args.image_size,
        args.data,
        args.studies_dir,
        seconds=args.trial_seconds,
        warmup_steps=args.warmup_steps,
        window=3,
        lr_scaling=args.lr_scaling,
        baseline=baseline,
        **batch,
    )
    return SearchSettings(
        **shared,
        space=args.space,
        sampler=args.sampler,
        seed=args.seed,
        base=base,
        confirm_rounds=args.confirm_rounds,
        confirm_top=args.confirm_top,
        parity_steps=args.parity_steps,
        memory_headroom=headroom,
    )


def _pipeline_spec(args: argparse.Namespace) -> str | None:
    """--pipeline, or the script spec --script and --script-args make (its path checked and made absolute)."""

    if args.script is None:
        if args.script_args is not None:
            raise ConfigError("--script-args needs --script")
        return args.pipeline
    if args.pipeline is not None:
        raise ConfigError("--script and --pipeline both name the pipeline: give one")
    try:
        words = shlex.split(args.script_args or "")
    except ValueError as e:
        raise ConfigError(f"--script-args: cannot split it ({e})") from None
    return script.spec_of(args.script, words)


def _shared_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings `search` and `worker` take alike."""

    timeout = args.trial_timeout
    return dict(
        budget_s=parse_duration(args.budget) if args.budget is not None else None,
        study=args.study,
        storage=args.storage,
        trial_timeout_s=parse_duration(timeout, "--trial-timeout") if timeout is not None else None,
        n_trials=args.n_trials,
        force=args.force,
        studies_dir=args.studies_dir,
        skip_bad_data=args.skip_bad_data,
    )


def cmd_worker(args: argparse.Namespace) -> int:
    import optuna

    from autotune.search.store import fleet  # lazy: optuna
    from autotune.search.loop.session import SearchSession  # lazy: optuna, psutil (--help starts without)

    if args.budget is None and args.n_trials is None:
        raise AutotuneError("worker needs --budget or --n-trials")
    check_folder(f"--studies-dir {args.studies_dir}", args.studies_dir)
    check_journal(args.storage)
    apply_cpus(args)
    apply_nodes(args)
    settings = SearchSettings(**_shared_settings(args))
    # Confirmation, parity and headroom come from the study; the worker that finishes last confirms.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    console = _console()
    with _data_progress(console) as progress:
        session = SearchSession.join(
            settings,
            args.data,
            warm=not args.cold_start,
            say=_plain(console),
            progress=progress,
            allowed=_allowed(args.pipeline) or fleet.DEFAULT_ALLOWED,
        )
    return _run(session, console)


def _allowed(pipelines: list[str] | None) -> list[str]:
    """A worker's --pipeline values as a study records them: a script's path made absolute."""

    return [kind_of(p).normalize() for p in pipelines or ()]


def _run(session: Any, console: Any) -> int:
    """Run the session under the live display, then the leaderboard and where the best went."""
    # lazy: rich, optuna (--help starts without)
    from autotune.apply.display import (
        LiveSearch,
        confirmation_table,
        export_notes,
        leaderboard_table,
        order_note,
        training_note,
    )
    from autotune.search.loop.alone import said
    from autotune.search.store.results import checks_summary

    s = session.settings
    limit = "no time limit" if s.budget_s is None else f"budget {s.budget_s:.0f} s"
    console.print(
        f"autotune: study {s.study!r} in {shown_storage(s.storage)}, {limit}, "
        f"{len(session.searched)} knobs searched: {', '.join(session.searched)}",
        highlight=False,
    )
    budget = Budget.of(s)  # one clock for the session's deadlines and the panel's countdown
    with LiveSearch(session.study, budget, console) as live:
        outcome = session.run(live.events(), budget, patch=patched_copy)
    console.print(leaderboard_table(session.study))
    if outcome.confirmation:
        console.print(confirmation_table(session.study))
        note = order_note(session.study)
        if note:
            console.print(f"autotune: {note}", highlight=False)
    checks = checks_summary(session.study)
    if checks:
        failed = [k for k, v in checks["classes"].items() if v["verdict"] == Verdict.FAIL]
        console.print(
            f"autotune: {len(checks['classes'])} training-math class(es) checked in {checks['check_seconds']:.0f} s"
            + (
                f"; failed: {'; '.join(failed)} ({checks['trials_in_failed_classes']} of {checks['trials']} "
                f"trials run were in them, {checks['share_of_trial_time_in_failed_classes']:.0%} of trial "
                f"time; {checks['written_off']} later proposal(s) in them written off unrun)"
                if failed
                else ""
            ),
            highlight=False,
        )
    if outcome.best_yaml is None:
        console.print("autotune: no trial finished, nothing to export")
    else:
        console.print(f"autotune: {training_note(session.study)}", highlight=False)
        for line in export_notes(session.study):  # the confirmation's verdict, the faster configs passed over
            console.print(f"autotune: {line}", highlight=False)
        if outcome.alone:  # a script study's last word: the figure the user gets
            console.print(
                f"autotune: your script alone, as written against the export applied: {said(outcome.alone)}",
                highlight=False,
            )
        console.print(
            f"autotune: best config exported to {outcome.best_yaml}\n"
            f"{_apply_lines(s, outcome.best_yaml)}"
            f"  inspect:   optuna-dashboard {shown_storage(s.storage)} --artifact-dir "
            f"{Path(s.studies_dir) / 'artifacts'}",
            highlight=False,
        )
    if outcome.error:
        print(f"autotune: error: {outcome.error}", file=sys.stderr)
    return outcome.code


def _apply_lines(s: Any, best_yaml: Path) -> str:
    """How to use the export: a script's real training with it applied (what was measured, no edit) and its
    change as a diff to the source; another pipeline's re-measure."""

    if not kind_of(s.base.pipeline).has_run_command:
        return f"  apply it:  autotune trial --config {best_yaml}\n"
    path, args = script.parse(s.base.pipeline)
    where = (f" --study {s.study}" if s.study != "autotune" else "") + (
        f" --storage {shown_storage(s.storage)}" if s.storage else ""
    )
    return (
        f"  apply it:  autotune run --config {best_yaml} {shlex.join([path, *args])}\n"
        f"  or edit your source:  autotune export{where} --format diff -o tuned.diff  (patch -p0 < tuned.diff)\n"
    )


@contextlib.contextmanager
def _data_progress(console: Any) -> Iterator[Any]:
    """A progress bar for the up-front data check, shown only when the set is large enough to wait for."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("checking data"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if total < LARGE_DATA:
            return
        if task is None:
            bar.start()
            task = bar.add_task("data", total=total)
        bar.update(task, completed=done)

    try:
        yield update
    finally:
        bar.stop()


def _dim(console: Any) -> Any:
    return lambda text: console.print(f"[dim]{text}[/dim]", highlight=False)


def _plain(console: Any) -> Any:
    return lambda text: console.print(text, markup=False, highlight=False)
