"""`show`, `export`, `ablate` and `report`: read a study, explain it, hand its best config over."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from autotune.apply.export import FORMATS, render
from autotune.cli._common import check_folder, new_console, study_args
from autotune.core.errors import ExitCode
from autotune.core.files import write_atomic


def register(sub: Any) -> None:
    s = sub.add_parser("show", help="print the leaderboard of a study", description="Print the leaderboard of a study.")
    study_args(s)
    s.add_argument("--top", type=int, default=10, help="rows to show (default 10)")
    s.set_defaults(func=cmd_show)

    e = sub.add_parser("export", help="export the best config", description="Export the best config.")
    study_args(e)
    e.add_argument("-o", "--output", default=None, help="file to write (default: print)")
    e.add_argument(
        "--format",
        default="yaml",
        choices=FORMATS,
        help="yaml (native), lightning, hf, accelerate, script (the lines to change in a script study's script) "
        "or diff (those changes as a unified diff against it: patch -p0 < FILE)",
    )
    e.set_defaults(func=cmd_export)

    a = sub.add_parser(
        "ablate",
        help="measure each technique's contribution to the best config (waterfall)",
        description="Start from the study's baseline config; the best trial's knobs that differ from it are the "
        "techniques (num_workers travels with persistent_workers and prefetch_factor, which need workers). "
        "Greedily, at each step every remaining technique is added to the current config and measured as a "
        "real isolated trial on the study's workload; the one that helps most is kept. A technique whose "
        "trial fails (e.g. out of memory) is retried at the next step. With k techniques this runs up to "
        "1 + k(k+1)/2 trials. The steps go to the study's user attr 'ablation', a table is printed, and "
        "studies/<study>/ablation.png shows the waterfall; trial logs are under studies/<study>/ablation/.",
    )
    study_args(a, studies_dir="where trial logs and the PNG go (default studies)")
    a.add_argument(
        "--seconds", type=float, default=None, help="measured seconds per trial (default: the study's own trial length)"
    )
    a.add_argument(
        "--trial-timeout",
        type=float,
        default=None,
        metavar="S",
        help="kill a trial after this many seconds (default max(300, 20 x seconds))",
    )
    a.add_argument("--data", default=None, metavar="DIR", help="this machine's copy of the study's dataset")
    a.set_defaults(func=cmd_ablate)

    r = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a study, with PNG copies of its figures",
        description="Write one HTML file that opens offline (plotly.js is inlined, no CDN): the optimization "
        "history with the baseline as a line, parameter importances (Optuna's default evaluator; skipped with a "
        "note while the study has too few trials), the pareto front of samples/s against peak memory, the "
        "ablation waterfall if `autotune ablate` was run, the leaderboard with speedups, and the study's "
        "hardware/software fingerprint. Each figure is also written as a PNG (matplotlib) next to the HTML, "
        "named <report>-<figure>.png.",
    )
    study_args(r, studies_dir="where the default output goes (default studies)")
    r.add_argument(
        "-o", "--output", default=None, metavar="FILE", help="HTML file to write (default studies/<study>/report.html)"
    )
    r.set_defaults(func=cmd_report)


def _study(args: argparse.Namespace) -> Any:
    from autotune.search.loop.study import load_study  # lazy: optuna, not loaded for `autotune --help`

    return load_study(args.storage, args.study)


def cmd_show(args: argparse.Namespace) -> int:
    from autotune.apply.display import confirmation_table, cost_table, leaderboard_table, order_note  # lazy: optuna
    from autotune.apply.fit_table import FitTable  # lazy: rich, not loaded for `autotune --help`
    from autotune.apply.report import MEMORY_COLUMNS, memory_rows  # lazy: optuna, not loaded for `autotune --help`

    console, study = new_console(), _study(args)
    console.print(leaderboard_table(study, args.top))
    memory = memory_rows(study, args.top)
    if memory:
        console.print(
            FitTable(
                f"memory: estimate before launch vs measured peak, last {len(memory)} trials",
                MEMORY_COLUMNS,
                memory,
                long=(MEMORY_COLUMNS[-1],),
                left=("role", "strategy"),
            )
        )
    timed = cost_table(study, args.top)
    if timed is not None:
        console.print(timed)
    confirmed = confirmation_table(study)
    if confirmed is not None:
        console.print(confirmed)
        note = order_note(study)
        if note:
            console.print(f"autotune: {note}", highlight=False)
    return ExitCode.OK


def cmd_export(args: argparse.Namespace) -> int:
    from autotune.search.store.results import best_export  # lazy: optuna, not loaded for `autotune --help`

    out = Path(args.output) if args.output else None
    if out is not None:
        check_folder(f"--output {out}", out.parent)
    text = render(args.format, best_export(_study(args), args.storage, out))
    if out is None:
        sys.stdout.write(text)
    else:
        write_atomic(out, text)
        print(f"autotune: wrote {out}")
    if not text:  # the best is the script as written: an empty diff, which patch applies as nothing
        print("autotune: no change to apply: the export is the script as written", file=sys.stderr)
    return ExitCode.OK


def cmd_ablate(args: argparse.Namespace) -> int:
    import optuna  # lazy, this and the four below: optuna, not loaded for `autotune --help`
    from autotune.apply.ablate import run_ablation, table
    from autotune.apply.figures import waterfall_png
    from autotune.search.store.records import TrialRecord, throughput_unit
    from autotune.search.store.results import leaderboard

    check_folder(f"--studies-dir {args.studies_dir}", args.studies_dir)
    console = new_console()
    say = lambda s: console.print(s, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = _study(args)
    steps = run_ablation(
        study, args.studies_dir, say, data=args.data, seconds=args.seconds, trial_timeout=args.trial_timeout
    )
    console.print(table(steps, f"ablation of study {study.study_name}: greedy, each step measured"))
    best = leaderboard(study)[0]
    speedup = TrialRecord.from_frozen(best).speedup
    say(
        f"the search measured its best config (trial {best.number}) at {best.value:.2f} {throughput_unit(study)}"
        + (f", x{speedup:.2f} vs its baseline" if speedup else "")
        + f"; the ablation's last step: {steps[-1]['samples_per_s']:.2f} {throughput_unit(study)}, x{steps[-1]['speedup']:.2f}"
    )
    png = waterfall_png(
        steps,
        Path(args.studies_dir) / study.study_name / "ablation.png",
        f"Ablation of study {study.study_name}: contribution of each technique",
    )
    console.print(
        f"autotune: waterfall written to {png}; stored in study attr 'ablation' "
        f"(autotune report --study {study.study_name} includes it)",
        highlight=False,
        soft_wrap=True,
    )
    return ExitCode.OK


def cmd_report(args: argparse.Namespace) -> int:
    from autotune.apply.report import write_report  # lazy: optuna, plotly, matplotlib; not for `autotune --help`

    check_folder(f"--studies-dir {args.studies_dir}", args.studies_dir)
    if args.output:
        check_folder(f"--output {args.output}", Path(args.output).parent)
    study = _study(args)
    out = Path(args.output) if args.output else Path(args.studies_dir) / study.study_name / "report.html"
    files = write_report(study, out)
    print(f"autotune: wrote {files[0]}" + (f" and {len(files) - 1} PNG(s) next to it" if len(files) > 1 else ""))
    return ExitCode.OK
