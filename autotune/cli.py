"""`autotune` subcommands. The only place that reads argv and turns AutotuneError into exit code 2."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from autotune.errors import AutotuneError

EXIT_BAD_INPUT, EXIT_INTERRUPTED = 2, 130
# Subcommands that live with their implementation: each module has register(subparsers).
_APPLY = ("autotune.train", "autotune.ablate", "autotune.report")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors are bad input too: exit 2, one line
        self.exit(EXIT_BAD_INPUT, f"autotune: error: {message} (see `{self.prog} --help`)\n")


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", metavar="DIR", help="dataset folder, passed to the pipeline as data_dir: the unet "
                   "reads DIR/images and DIR/masks (default: a synthetic set generated once under studies/data)")
    p.add_argument("--image-size", type=int, default=None, metavar="PX", help="training crop size (default 128)")
    p.add_argument("--pipeline", default=None, metavar="MODULE:FACTORY",
                   help="training pipeline: 'unet' (default) or an importable factory returning a Pipeline")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autotune", description="Find the fastest way to train a PyTorch model on this machine.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("search", help="search the knobs jointly with Optuna within a time budget",
                       description="Run a budgeted Optuna search. Trial 0 is the plain-PyTorch baseline, trial 1 "
                       "the published guides' recommendation; every trial is a short measured run in its own "
                       "process. Results go to an Optuna study (`optuna-dashboard studies.db`), the best config "
                       "to studies/<study>/best.yaml. Re-running with the same --study resumes it; --budget then "
                       "counts afresh for this run.")
    s.add_argument("--budget", required=True, help="wall time for this run: 2h, 90m, 1h30m, 45s or seconds")
    s.add_argument("--study", default="autotune", help="study name; an existing study is resumed (default autotune)")
    s.add_argument("--storage", default=None, help="Optuna storage: a journal file path (default studies.db), "
                   "sqlite:///x.db, postgresql://user:pass@host/db or grpc://host:port")
    s.add_argument("--space", default=None, metavar="FILE", help="search-space YAML (default search_spaces/default.yaml)")
    s.add_argument("--sampler", default="tpe", choices=("tpe", "gp", "random"), help="Optuna sampler (default tpe)")
    s.add_argument("--seed", type=int, default=None, help="sampler seed")
    s.add_argument("--trial-timeout", default=None, help="kill a trial after this long (default: max(2m, budget/4))")
    s.add_argument("--trial-seconds", type=float, default=15.0, help="measured seconds per trial, after warm-up (default 15)")
    s.add_argument("--warmup-steps", type=int, default=3, help="untimed steps before measuring (default 3)")
    s.add_argument("--n-trials", type=int, default=None, help="stop after this many trials")
    s.add_argument("--force", action="store_true", help="resume a study recorded on different hardware/software")
    s.add_argument("--cold-start", action="store_true",
                   help="start every trial as a fresh interpreter instead of forking a warm one (slower start-up)")
    s.add_argument("--create-only", action="store_true",
                   help="create the study (space, workload, fingerprint, baseline) and exit: workers then join it")
    s.add_argument("--studies-dir", default="studies", help="where trial logs, artifacts and exports go")
    _workload_args(s)

    t = sub.add_parser("trial", help="run one measured trial of a config",
                       description="Run one trial in its own process group (under torchrun when gpus > 1) and "
                       "write its result JSON. Exit codes: 0 ok, 2 bad config, 3 out of memory, 4 non-finite "
                       "loss, 5 knob unsupported here, 1 crash.")
    t.add_argument("--config", required=True, help="YAML/JSON TrialConfig, or an exported best.yaml as it is")
    t.add_argument("--out", default=None, help="result JSON (default: <config dir>/trial/result.json)")
    t.add_argument("--timeout", type=float, default=900.0, help="seconds before the trial is killed (default 900)")
    t.add_argument("--profile", action="store_true", help="write a torch.profiler summary (profile.txt) next to the result")
    t.add_argument("--steps", type=int, default=None, help="timed steps (default: the config's)")
    t.add_argument("--seconds", type=float, default=None, help="measure for this long instead of a step count")
    _workload_args(t)

    for name, helptext in (("show", "print the leaderboard of a study"), ("export", "export the best config")):
        e = sub.add_parser(name, help=helptext, description=helptext + ".")
        e.add_argument("--study", default="autotune", help="study name (default autotune)")
        e.add_argument("--storage", default=None, help="Optuna storage (default studies.db journal)")
        if name == "show":
            e.add_argument("--top", type=int, default=10, help="rows to show (default 10)")
        else:
            from autotune.export import FORMATS

            e.add_argument("-o", "--output", default=None, help="file to write (default: print)")
            e.add_argument("--format", default="yaml", choices=FORMATS, help="yaml (native), lightning, hf or accelerate")

    w = sub.add_parser("worker", help="join an existing study and run trials (many machines, one study)",
                       description="Join a study created by `autotune search` (usually on PostgreSQL) and run its "
                       "trials until --budget or --n-trials is spent. The space, workload and fingerprint come from "
                       "the study; a machine whose fingerprint differs is refused.")
    w.add_argument("--storage", required=True, help="the study's storage URL (postgresql://…, grpc://host:port, …)")
    w.add_argument("--study", required=True, help="study name")
    w.add_argument("--budget", default=None, help="wall time for this worker (2h, 90m, …)")
    w.add_argument("--n-trials", type=int, default=None, help="stop after this many trials")
    w.add_argument("--data", default=None, metavar="DIR", help="this machine's copy of the dataset, if not at the study's path")
    w.add_argument("--studies-dir", default="studies", help="where trial logs and artifacts go")
    w.add_argument("--force", action="store_true", help="join although this machine's fingerprint differs")
    w.add_argument("--cold-start", action="store_true", help="start every trial as a fresh interpreter")

    p = sub.add_parser("storage-proxy", help="serve a storage to workers over gRPC (Optuna's GrpcStorageProxy)",
                       description="Run Optuna's gRPC storage proxy in front of one RDB storage, so a large fleet "
                       "needs one database connection pool instead of one per worker. Workers use --storage grpc://HOST:PORT.")
    p.add_argument("--storage", required=True, help="the RDB storage URL to serve")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=13000, help="port (default 13000)")

    for module in _APPLY:
        import importlib

        importlib.import_module(module).register(sub)

    m = sub.add_parser("make-data", help="write a synthetic person-segmentation dataset",
                       description="Write JPEG photos with person-like figures and PNG masks; deterministic per seed.")
    m.add_argument("dir", help="output folder (must not exist or be empty)")
    m.add_argument("--n", type=int, default=256, help="number of images (default 256)")
    m.add_argument("--size", default="640x480", help="source image size WxH (default 640x480)")
    m.add_argument("--seed", type=int, default=0)
    return parser


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        handler = getattr(args, "func", None) or COMMANDS[args.command]
        return int(handler(args) or 0)
    except AutotuneError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _base(args: argparse.Namespace, **extra: Any) -> Any:
    from autotune.config import TrialConfig
    from autotune.data import default_data

    cfg = TrialConfig(**extra)
    changes: dict[str, Any] = {}
    if args.pipeline:
        changes["pipeline"] = args.pipeline
    if args.image_size:
        changes["image_size"] = args.image_size
    if args.data:
        changes["data_dir"] = str(Path(args.data).resolve())
    elif cfg.data_dir is None and (args.pipeline or cfg.pipeline) == "unet":
        changes["data_dir"] = str(default_data(getattr(args, "studies_dir", "studies")))
    return cfg.replace(**changes)


def cmd_search(args: argparse.Namespace) -> int:
    from rich.console import Console

    from autotune.config import SearchSettings, parse_duration
    from autotune.fingerprint import fingerprint
    from autotune.pipelines import load_pipeline, stages_of, unsupported_of
    from autotune.search_space import Hardware, load_space, resolve

    # Validate everything before a study is touched.
    budget = parse_duration(args.budget)
    timeout = parse_duration(args.trial_timeout) if args.trial_timeout else None
    space_path = args.space or str(Path(__file__).resolve().parent.parent / "search_spaces" / "default.yaml")
    space = load_space(space_path)
    console = Console(stderr=False)
    base = _base(args, seconds=args.trial_seconds, warmup_steps=args.warmup_steps, window=3)
    settings = SearchSettings(budget_s=budget, study=args.study, storage=args.storage, space=space_path,
                              sampler=args.sampler, seed=args.seed, trial_timeout_s=timeout, n_trials=args.n_trials,
                              force=args.force, studies_dir=args.studies_dir, base=base)
    pipeline = load_pipeline(base)
    hw = Hardware.detect()
    space, notes = resolve(space, hw, stages=len(stages_of(pipeline)), unsupported=unsupported_of(pipeline))
    for note in notes:
        console.print(f"[dim]space: {note}[/dim]", highlight=False)
    from autotune.storage import open_storage
    from autotune.study import open_study

    storage = open_storage(settings.storage)
    study = open_study(settings, storage, fingerprint(base), space, hw)
    if args.create_only:
        console.print(f"autotune: study {study.study_name!r} ready in {_shown_storage(settings.storage)}; "
                      f"join it with: autotune worker --storage URL --study {study.study_name}", highlight=False)
        return 0
    return _search_loop(study, space, settings, console, warm=not args.cold_start)


def _warm_server(pipeline: str, console: Any) -> Any:
    """A long-lived process with torch and the pipeline imported; trials fork from it (issue: start-up)."""
    from autotune.pipelines import BUILTIN
    from autotune.warm import DEFAULT_PRELOAD, WarmServer, WarmServerError

    module = BUILTIN.get(pipeline, pipeline).partition(":")[0]
    try:
        return WarmServer.start(preload=(*DEFAULT_PRELOAD, module))
    except WarmServerError as e:
        console.print(f"autotune: warm start unavailable, trials start cold: {e}", markup=False)
        return None


def _search_loop(study: Any, space: Any, settings: Any, console: Any, warm: bool = True) -> int:
    from autotune.display import LiveSearch
    from autotune.study import run_search

    console.print(f"autotune: study {study.study_name!r} in {_shown_storage(settings.storage)}, budget "
                  f"{settings.budget_s:.0f} s, {len(space.searched())} knobs searched: {', '.join(space.searched())}",
                  highlight=False)
    interrupted = False
    # SIGTERM behaves like Ctrl-C: the current trial is killed and recorded, the best so far exported.
    signal.signal(signal.SIGTERM, _interrupt)
    server = _warm_server(settings.base.pipeline, console) if warm else None
    try:
        with LiveSearch(study, settings.budget_s, console) as live:
            run_search(study, space, settings, live.events(), server)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if server is not None:
            server.close()
    _finish(study, settings, console)
    return EXIT_INTERRUPTED if interrupted else 0


def cmd_worker(args: argparse.Namespace) -> int:
    import optuna
    from rich.console import Console

    from autotune.config import SearchSettings, parse_duration
    from autotune.fingerprint import differences, fingerprint
    from autotune.pipelines import load_pipeline
    from autotune.search_space import SearchSpace
    from autotune.study import study_workload

    if not args.budget and not args.n_trials:
        raise AutotuneError("worker needs --budget or --n-trials")
    budget = parse_duration(args.budget) if args.budget else 365 * 86400.0
    study = _load_study(args)
    attrs = study.user_attrs
    if "space" not in attrs:
        raise AutotuneError(f"study {args.study!r} was not created by `autotune search` (no space attr)")
    base = study_workload(study, args.data, args.studies_dir)
    load_pipeline(base)  # a module this machine can't import is bad input, not a run of failed trials
    diff = differences(attrs.get("fingerprint", {}), fingerprint(base))
    if diff and not args.force:
        raise AutotuneError(f"this machine differs from study {args.study!r}'s ({'; '.join(diff)}); "
                            "its timings would not be comparable (--force to join anyway)")
    settings = SearchSettings(budget_s=budget, study=args.study, storage=args.storage, n_trials=args.n_trials,
                              studies_dir=args.studies_dir, base=base)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return _search_loop(study, SearchSpace.from_dict(attrs["space"]), settings, Console(), warm=not args.cold_start)


def cmd_storage_proxy(args: argparse.Namespace) -> int:
    import optuna

    from autotune.storage import open_storage

    storage = open_storage(args.storage)
    print(f"autotune: serving {_shown_storage(args.storage)} on grpc://{args.host}:{args.port}", flush=True)
    optuna.storages.run_grpc_proxy_server(storage, host=args.host, port=args.port)
    return 0


def _shown_storage(url: str | None) -> str:
    from autotune.export import mask_url
    from autotune.storage import DEFAULT_STORAGE

    return mask_url(url or DEFAULT_STORAGE)


def _finish(study: Any, settings: Any, console: Any) -> None:
    from autotune.display import leaderboard_table
    from autotune.export import render, write_atomic
    from autotune.study import leaderboard

    console.print(leaderboard_table(study))
    if not leaderboard(study):
        console.print("autotune: no trial finished, nothing to export")
        return
    out = Path(settings.studies_dir) / study.study_name / "best.yaml"
    write_atomic(out, render("yaml", _export(study, settings.storage, out)))
    console.print(f"autotune: best config exported to {out}\n"
                  f"  apply it:  autotune trial --config {out}\n"
                  f"  inspect:   optuna-dashboard {_shown_storage(settings.storage)} --artifact-dir "
                  f"{Path(settings.studies_dir) / 'artifacts'}", highlight=False)


def _export(study: Any, storage: str | None, out: Path | None) -> Any:
    from autotune.config import TrialConfig, TrialResult
    from autotune.export import Export
    from autotune.study import baseline_sps, leaderboard

    board = leaderboard(study)
    if not board:
        raise AutotuneError(f"study {study.study_name!r} has no finished feasible trial to export")
    best = board[0]
    cfg = TrialConfig.from_dict({**study.user_attrs.get("workload", {}), **best.user_attrs["config"]})
    result = TrialResult.from_dict({"status": "ok", **best.user_attrs})
    return Export.from_result(
        cfg, result, baseline_samples_per_s=baseline_sps(study), environment=study.user_attrs.get("fingerprint", {}),
        study={"name": study.study_name, "trial": best.number, "storage": _shown_storage(storage)},
        reproduce=f"autotune trial --config {out or 'best.yaml'}")


def _load_study(args: argparse.Namespace) -> Any:
    import optuna

    from autotune.storage import open_storage
    from autotune.study import make_pruner, make_sampler

    storage = open_storage(args.storage)
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    if args.study not in summaries:
        raise AutotuneError(f"no study {args.study!r} in {_shown_storage(args.storage)} "
                            f"(studies there: {', '.join(summaries) or 'none'})")
    sampler = make_sampler(summaries[args.study].user_attrs.get("sampler", "tpe"), None)
    return optuna.load_study(study_name=args.study, storage=storage, sampler=sampler, pruner=make_pruner())


def cmd_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from autotune.display import leaderboard_table

    Console().print(leaderboard_table(_load_study(args), args.top))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from autotune.export import render, write_atomic

    out = Path(args.output) if args.output else None
    text = render(args.format, _export(_load_study(args), args.storage, out))
    if out is None:
        sys.stdout.write(text)
    else:
        write_atomic(out, text)
        print(f"autotune: wrote {out}")
    return 0


def cmd_trial(args: argparse.Namespace) -> int:
    from autotune import errors, launcher
    from autotune.export import load_config

    cfg = load_config(args.config)
    extra: dict[str, Any] = {}
    if args.steps:
        extra["timed_steps"] = args.steps
    if args.seconds:
        extra["seconds"] = args.seconds
    if args.profile:
        extra["profile"] = True
    cfg = _base(args, **{**cfg.to_dict(), **extra})
    out = Path(args.out) if args.out else Path(args.config).resolve().parent / "trial" / "result.json"
    trial_dir = out.parent
    try:
        result = launcher.run_trial(cfg, trial_dir, args.timeout)
    except errors.TrialFailure as e:
        print(f"autotune trial: {e.reason}: {e}", file=sys.stderr)
        if e.log_tail and e.reason in ("crash", "timeout"):
            print(e.log_tail, file=sys.stderr)
        return {"oom": 3, "numerics": 4, "unsupported": 5, "bad_config": 2}.get(e.reason, 1)
    if out != trial_dir / "result.json":
        os.replace(trial_dir / "result.json", out)
    print(f"autotune trial: {result.samples_per_s:.2f} samples/s  step p50 {result.step_time_p50 * 1e3:.0f} ms "
          f"p90 {result.step_time_p90 * 1e3:.0f} ms  data wait {result.data_wait_fraction:.0%}  "
          f"peak {result.peak_memory_bytes / 2**20:.0f} MiB  startup {result.startup_s:.1f} s  -> {out}")
    return 0


def cmd_make_data(args: argparse.Namespace) -> int:
    from autotune.data import make_data, parse_size

    path = make_data(args.dir, args.n, parse_size(args.size), args.seed)
    print(f"autotune: wrote {args.n} images and masks to {path}")
    return 0


COMMANDS = {"search": cmd_search, "trial": cmd_trial, "show": cmd_show, "export": cmd_export,
            "make-data": cmd_make_data, "worker": cmd_worker, "storage-proxy": cmd_storage_proxy}

if __name__ == "__main__":
    sys.exit(main())
