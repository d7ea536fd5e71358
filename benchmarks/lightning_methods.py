"""One Lightning speedup measured three ways in the same rounds: the user's own Trainer.fit, a cold
`autotune trial`, and a trial forked from the warm server (as a search's confirmation runs it).

lightning_export.py compares the search's confirmed ratio, taken during the search, with the user's
runs taken minutes later. When the two disagree, this script asks whether the way autotune measures
differs from the user's script, or whether the machine drifted between the two: it takes the baseline
and the exported config by each method, six fresh processes a round, the order reversed on odd rounds,
and prints each method's median of per-round ratios (tuned / baseline, the same round), then each trial
method's ratio against the user's ratio of the same round. The user's runs are lightning_export.py's
(`user_run`, with the export's lr factor).

    PYTHONPATH=. python benchmarks/lightning_methods.py --from DIR [--rounds 4]

DIR is a finished `lightning_export.py --out DIR`: its study's best.yaml gives the exported config and
the workload, its tuned_lightning.py the user's arguments. Each run's figures go to DIR/methods/.
Exit code 0; 1 a run failed; 2 bad input (one line).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks.lightning_export import EXPORT, STUDY, Parser, uptime, user_run  # noqa: E402

KINDS = ("user baseline", "cold baseline", "warm baseline", "user tuned", "cold tuned", "warm tuned")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="lightning_methods.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="src", required=True, metavar="DIR", help="a finished lightning_export.py --out DIR")
    p.add_argument("--rounds", type=int, default=4, help="rounds of six runs (default 4)")
    p.add_argument("--steps", type=int, default=300, help="the user runs' timed batches of 8 (default 300)")
    args = p.parse_args(argv)
    src = Path(args.src)
    best = src / "studies" / STUDY / "best.yaml"
    if not best.is_file() or not (src / EXPORT).is_file():
        p.error(f"--from {src}: no {best} and {src / EXPORT} (run lightning_export.py --out {src} first)")
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: at least 1")
    import yaml

    from autotune import pipelines
    from autotune.core.config import BASELINE, TrialConfig
    from autotune.core.errors import TrialFailure
    from autotune.trial.processes import launcher
    from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer

    exported = yaml.safe_load(best.read_text())
    tuned = TrialConfig.from_dict({**exported["workload"], **exported["config"]})
    lr_scale = float((exported.get("framework") or {}).get("lr_scale") or 1.0)
    base = TrialConfig.from_dict({**exported["workload"], **BASELINE.knobs()})
    out = src / "methods"
    print(f"command: {' '.join([sys.executable, *sys.argv])}\nload at start: {uptime()}", flush=True)
    print(f"exported config {exported['config']}; the user's tuned runs train at lr x{lr_scale:.4g}", flush=True)
    server = WarmServer.start(preload=(*DEFAULT_PRELOAD, *pipelines.preload_modules(tuned.pipeline)))
    figures: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        for r in range(args.rounds):
            for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                how, which = kind.split()
                folder = out / f"round-{r}" / kind.replace(" ", "-")
                folder.mkdir(parents=True, exist_ok=True)
                if how == "user":  # with the export's lr factor, as lightning_export.py's own user runs
                    sps = user_run(which, src, r, args.steps, lr_scale, runs=folder)["samples_per_s"]
                else:
                    cfg = tuned if which == "tuned" else base
                    sps = launcher.run_trial(cfg, folder, 900, server=server if how == "warm" else None).samples_per_s
                figures[kind].append(float(sps or 0))
                print(f"round {r} {kind:14s} {sps:8.1f} samples/s  load {os.getloadavg()[0]:.2f}", flush=True)
    except (RuntimeError, TrialFailure) as e:
        print(f"lightning_methods.py: a run failed: {e}", file=sys.stderr)
        return 1
    finally:
        server.close()
    print("\nmedian samples/s (per round)")
    for kind, xs in figures.items():
        print(f"  {kind:14s} {statistics.median(xs):8.1f}   " + "  ".join(f"{x:.1f}" for x in xs))
    print("tuned / baseline, same round: the median (per round)")
    ratios = {
        how: [t / b for t, b in zip(figures[f"{how} tuned"], figures[f"{how} baseline"])]
        for how in ("user", "cold", "warm")
    }
    for how, xs in ratios.items():
        print(f"  {how:5s} x{statistics.median(xs):.3f}   " + "  ".join(f"{x:.2f}" for x in xs))
    # The methods compared round by round: a slow spell that moves one round's ratios moves them alike.
    print("a trial's ratio / the user's ratio - 1, same round: the median (per round)")
    for how in ("cold", "warm"):
        gaps = [a / u - 1 for a, u in zip(ratios[how], ratios["user"])]
        print(f"  {how:5s} {statistics.median(gaps):+.1%}   " + "  ".join(f"{x:+.0%}" for x in gaps))
    (out / "figures.json").write_text(json.dumps(figures, indent=1))
    print(f"load at end: {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
