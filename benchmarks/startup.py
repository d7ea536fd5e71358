"""Trial start-up, side by side in one run: cold `python -m autotune.trial`, a warm fork from
`autotune.trial.processes.warm_client.WarmServer`, and cold `torchrun --nproc-per-node 2`.

Every trial is the real Unet pipeline (64 px, 1 warm-up and 2 timed steps by default), started the
way the launcher starts it, with AUTOTUNE_LAUNCH_TIME set at launch. The pipeline is named through
`benchmarks.startup:timed_unet`, a wrapper that records when the trial reached the pipeline factory
(imports done) and how long building the pipeline, the model and the dataset took, so the start-up
that does not depend on the config can be separated from the part that does:

    to factory      launch -> the pipeline factory is called (process start, imports, rendezvous)
    build           UnetPipeline(cfg) + build_model() + build_dataset(): depends on the config
    startup_s       the trial's own figure: launch -> ready for the first step (loader built)
    fixed           startup_s - build: the goal (warm <= 0.5 s)
    to result       launch -> result.json written
    to exit         launch -> the process's exit seen by the controller

The modes run in rounds, interleaved, odd rounds reversed, so drift and other load hit them alike;
the summary gives medians and the warm/cold ratio of each column. The warm server's own start (paid
once per study) is printed separately.

    .venv/bin/python benchmarks/startup.py [--repeats 5]

Exit code: 0 when every trial finished, 1 when any failed (the others are still reported).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from autotune.trial.processes import launcher  # noqa: E402
from autotune.core.config import TrialConfig  # noqa: E402
from autotune.core.files import write_json_atomic  # noqa: E402
from autotune.core.procs import die_with_parent  # noqa: E402
from autotune.trial.loop.worker import LAUNCH_TIME_ENV  # noqa: E402
from autotune.trial.processes.warm_client import WarmServer  # noqa: E402

TIMES_ENV = "AUTOTUNE_BENCH_TIMES"
MODES = ("cold", "warm", "torchrun-2")
COLUMNS = ("to_factory", "build", "startup_s", "fixed", "to_result", "to_exit")


# --- inside the trial: the timed pipeline ---------------------------------------------------------


def timed_unet(cfg: Any) -> Any:
    """The built-in Unet pipeline, timing its own construction. Runs inside the trial process."""
    # The pipeline's modules first: a cold trial imports them at this point too (resolve_factory
    # imports the pipeline module; smp comes with the first UnetPipeline), so they count as start-up.
    import segmentation_models_pytorch  # noqa: F401

    from autotune.pipelines.unet.pipeline import UnetPipeline

    launched = float(os.environ[LAUNCH_TIME_ENV])
    t0 = time.time()
    times: dict[str, float] = {"to_factory": t0 - launched}
    pipeline = UnetPipeline(cfg)
    build_model, build_dataset = pipeline.build_model, pipeline.build_dataset

    def timed_model() -> Any:
        t = time.time()
        model = build_model()
        times["model"] = time.time() - t
        return model

    def timed_dataset() -> Any:
        dataset = build_dataset()
        # harness.build calls build_dataset last: the pipeline is now fully built.
        times["build"] = time.time() - t0
        times["to_built"] = time.time() - launched
        out = Path(f"{os.environ[TIMES_ENV]}.rank{os.environ.get('RANK', '0')}")
        out.write_text(json.dumps(times))
        return dataset

    pipeline.build_model, pipeline.build_dataset = timed_model, timed_dataset  # type: ignore[method-assign]
    return pipeline


# --- the controller -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="rounds over the three modes (default 5)")
    p.add_argument("--image-size", type=int, default=64, help="training crop size in px (default 64)")
    p.add_argument("--batch-size", type=int, default=4, help="per-process batch size (default 4)")
    p.add_argument(
        "--data", metavar="DIR", help="dataset folder (default: 32 small synthetic images in the temp folder)"
    )
    p.add_argument("--out-dir", metavar="DIR", help="where trial folders go (default: a fresh temp folder)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a trial is killed (default 300)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def run_one(mode: str, cfg: TrialConfig, trial_dir: Path, server: WarmServer, timeout_s: float) -> dict[str, float]:
    trial_dir.mkdir(parents=True)
    write_json_atomic(trial_dir / "config.json", cfg.replace(gpus=2 if mode == "torchrun-2" else 1).to_dict())
    cmd = launcher.command(TrialConfig(gpus=2 if mode == "torchrun-2" else 1), trial_dir)
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    log_path = trial_dir / "trial.log"
    launched = time.time()
    env = {
        **os.environ,
        LAUNCH_TIME_ENV: repr(launched),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": pythonpath,
        TIMES_ENV: str(trial_dir / "times"),
    }
    proc: Any
    if mode == "warm":
        proc = server.spawn(cmd[3:], env, os.getcwd(), log_path)  # what follows `python -m autotune.trial`
    else:
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=die_with_parent
            )
    try:
        code = proc.wait(timeout=timeout_s)
        to_exit = time.time() - launched
    finally:
        launcher.kill_group(proc, grace_s=1.0)  # as the launcher does: nothing outlives a trial
    result_path = trial_dir / "result.json"
    if code != 0 or not result_path.exists():
        raise RuntimeError(f"{mode} trial exited {code}:\n{launcher.tail(log_path, 15)}")
    result = json.loads(result_path.read_text())
    times = json.loads((trial_dir / "times.rank0").read_text())
    return {
        "to_factory": times["to_factory"],
        "build": times["build"],
        "startup_s": result["startup_s"],
        "fixed": result["startup_s"] - times["build"],
        "to_built": times["to_built"],
        "to_result": result_path.stat().st_mtime - launched,
        "to_exit": to_exit,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="startup-bench-"))
    if args.data:
        data = Path(args.data)
    else:
        from autotune.pipelines.unet.data import make_data

        data = make_data(out / "data", n=32, size=(160, 120), seed=0)
    cfg = TrialConfig(
        pipeline="benchmarks.startup:timed_unet",
        data_dir=str(data),
        image_size=args.image_size,
        batch_size=args.batch_size,
        warmup_steps=1,
        timed_steps=2,
        window=1,
        num_threads=1,
    )
    print(
        f"Unet-r34 at {args.image_size} px, batch {args.batch_size}, 1 warm-up + 2 timed steps, 1 intra-op thread; "
        f"{args.repeats} round(s) x {len(MODES)} modes; trial folders under {out}"
    )

    t = time.perf_counter()
    server = WarmServer.start()
    print(f"warm server start (once per study): {time.perf_counter() - t:.2f} s\n")
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    failed = 0
    try:
        for r in range(args.repeats):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                try:
                    row = run_one(mode, cfg, out / f"r{r}-{mode}", server, args.timeout)
                except Exception as e:  # noqa: BLE001 - report it and go on with the others
                    failed += 1
                    print(f"round {r} {mode:<11} FAILED: {e}")
                    continue
                rows[mode].append(row)
                print(
                    f"round {r} {mode:<11} "
                    + "  ".join(f"{c} {row[c]:6.2f}" for c in COLUMNS)
                    + f"  load {os.getloadavg()[0]:.1f}"
                )
    finally:
        server.close()

    print("\nmedians, seconds (launch = the controller starting the process or asking the server for a fork)")
    print(f"  {'mode':<11} " + " ".join(f"{c:>10}" for c in COLUMNS) + f" {'launch->built':>14}  n")
    med: dict[str, dict[str, float]] = {}
    for mode in MODES:
        if not rows[mode]:
            continue
        med[mode] = {c: statistics.median(row[c] for row in rows[mode]) for c in (*COLUMNS, "to_built")}
        print(
            f"  {mode:<11} "
            + " ".join(f"{med[mode][c]:10.3f}" for c in COLUMNS)
            + f" {med[mode]['to_built']:14.3f}  {len(rows[mode])}"
        )
    if "warm" in med and "cold" in med:
        print(
            "\nwarm/cold (ratio of medians): "
            + "  ".join(f"{c} {med['warm'][c] / med['cold'][c]:.3f}" for c in COLUMNS if med["cold"][c] > 0)
        )
        fixed = med["warm"]["fixed"]
        print(
            f"goal: warm start-up excluding dataset/model build <= 0.5 s: {fixed:.3f} s "
            f"({'met' if fixed <= 0.5 else 'MISSED'}); cold {med['cold']['fixed']:.3f} s"
            + (f", torchrun-2 {med['torchrun-2']['fixed']:.3f} s" if "torchrun-2" in med else "")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
