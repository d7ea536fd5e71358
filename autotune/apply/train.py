"""`autotune train`: apply a config for real. Full epochs, validation IoU per epoch, a checkpoint at the end,
and optionally the baseline trained the same way in the same run, so the speedup and the accuracy cost
(if any) are both on one screen."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any
from collections.abc import Callable

import torch
import torch.distributed as dist
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autotune.apply.comparison import METRIC_MARGIN, compare, paired
from autotune.core.config import TrialConfig, baseline_of
from autotune.core.configfile import load_config
from autotune.core.errors import AutotuneError, ExitCode, exit_code_for
from autotune.core.files import write_atomic, write_json_atomic
from autotune.core.procs import die_with_parent, exit_now
from autotune.core.outcomes import Reason
from autotune.trial.processes.launcher import run_process
from autotune.trial.loop.loading import val_loader
from autotune.trial.processes.nodes import python_for
from autotune.trial.loop.outcome import TRACEBACK_WORTHY, named_failure, read_verdicts, status_of
from autotune.trial.loop import harness, knobs
from autotune.trial.loop.knobs import ranks_share_gpus
from autotune.trial.loop.sharding import full_state_dict, is_sharded
from autotune.trial.measurement import measure

Say = Callable[[str], None]


class TrainFailed(Exception):
    """A training process failed on its own (crash, out of memory, divergence): its output says why."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile wraps outermost
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights as the pipeline's own build_model() names them: no DDP/compile/checkpoint wrappers.
    Under fsdp a collective: every rank calls it, and rank 0 gets the whole model (the others nothing)."""
    model = _unwrap(model)
    wrapped = knobs.wrapper_prefixes(model)
    out = {}
    for key, value in (full_state_dict(model) if is_sharded(model) else model.state_dict()).items():
        for prefix in wrapped:
            if key.startswith(prefix):
                key = prefix[: -len("inner.")] + key[len(prefix) :]
                break
        out[key] = value.detach().cpu().contiguous()
    return out


def _val_loader(h: Any) -> tuple[Any | None, str]:
    if not (hasattr(h.pipeline, "build_val_dataset") and hasattr(h.pipeline, "metric")):
        return None, "the pipeline has no build_val_dataset()/metric(): validation skipped"
    ds = h.pipeline.build_val_dataset()
    if len(ds) == 0:
        return None, "the validation set is empty (fewer than 10 samples?): validation skipped"
    return val_loader(ds, h.cfg), ""


def validate(h: Any, loader: Any) -> float:
    """Mean per-batch metric (IoU for the Unet), weighted by batch size. In fp32, so that the
    comparison is about what training produced, not about inference precision."""
    model = _unwrap(h.model)  # eager: a compiled model would recompile for eval mode
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(knobs.to_device(x, h.device, h.cfg))
            total += float(h.pipeline.metric(out, y.to(h.device))) * len(x)
            n += len(x)
    model.train()
    return total / n


def _epoch(h: Any, cfg: TrialConfig, epoch: int, epochs: int, name: str) -> tuple[float, float, int, int]:
    """One pass over the whole loader: (seconds, mean loss, samples, optimizer steps), the slowest rank's
    time and the mean loss over ranks. Data loading (and worker start-up) is inside the time."""
    if hasattr(h.loader.sampler, "set_epoch"):
        h.loader.sampler.set_epoch(epoch)
    losses: list[float] = []
    seen = 0
    columns = (
        TextColumn(f"[{name}] epoch {epoch}/{epochs}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("loss {task.fields[loss]}", markup=False),
    )
    total = -(-len(h.loader) // cfg.grad_accum)  # the last step may accumulate fewer micro-batches
    with Progress(*columns, transient=True, disable=not (h.rank == 0 and sys.stdout.isatty())) as bar:
        task = bar.add_task("train", total=total, loss="-")
        t0 = measure.now(h.device)  # synchronized
        for group in harness.grouped(iter(h.loader), cfg.grad_accum):  # every sample, no partial batch dropped
            losses.append(h.step(group))  # .item() in step: the step is finished on the device
            seen += sum(len(batch[1]) for batch in group)
            bar.update(task, advance=1, loss=f"{losses[-1]:.4f}")
        elapsed = measure.now(h.device) - t0
    stats = torch.tensor([elapsed, sum(losses) / max(1, len(losses))], dtype=torch.float64, device=h.device)
    if h.world > 1:  # the slowest rank's time; the mean loss over ranks
        dist.all_reduce(stats[:1], op=dist.ReduceOp.MAX)
        dist.all_reduce(stats[1:], op=dist.ReduceOp.SUM)
        stats[1] /= h.world
    # DDP's sampler pads the last shard: a few samples twice, as training does
    return float(stats[0]), float(stats[1]), seen * h.world, len(losses)


def train_one(cfg: TrialConfig, epochs: int, out: Path, name: str, say: Say) -> dict[str, Any]:
    """Train `cfg` for `epochs` epochs over the whole loader; rank 0 reports, validates and saves."""
    h = harness.build(cfg)
    lead = h.rank == 0
    # A sharded model's forward is a collective (each block all-gathers): every rank validates, rank 0 reports.
    validating = lead or _sharded(h.model)
    val, note = _val_loader(h) if validating else (None, "")
    if note and lead:
        say(f"[{name}] {note}")
    history: list[dict[str, Any]] = []
    for epoch in range(1, epochs + 1):
        elapsed, loss, samples, steps = _epoch(h, cfg, epoch, epochs, name)
        iou, t_val = None, time.perf_counter()
        if validating and val is not None:
            iou = validate(h, val)
        t_val = time.perf_counter() - t_val
        if h.world > 1:
            dist.barrier()  # the other ranks wait for rank 0's validation
        rec = {
            "epoch": epoch,
            "seconds": elapsed,
            "samples": samples,
            "optimizer_steps": steps,
            "samples_per_s": samples / elapsed,
            "loss": loss,
            "iou": iou,
            "val_seconds": t_val,
        }
        history.append(rec)
        say(
            f"[{name}] epoch {epoch}/{epochs}  {elapsed:7.2f} s  {rec['samples_per_s']:8.2f} samples/s  "
            f"loss {loss:.4f}  IoU {'-' if iou is None else f'{iou:.4f}'}"
            + (f"  (validation {t_val:.1f} s, not timed)" if iou is not None else "")
        )

    total_s = sum(r["seconds"] for r in history)
    summary = {
        "name": name,
        "config": cfg.to_dict(),
        "epochs": epochs,
        "world": h.world,
        "history": history,
        "optimizer_steps": sum(r["optimizer_steps"] for r in history),
        "global_batch": cfg.global_batch_size,
        "lr": cfg.effective_lr,
        "seconds": total_s,
        "samples_per_s": _rate(history),
        "steady_samples_per_s": _rate(history[1:]),
        "iou": history[-1]["iou"] if history else None,
        "checkpoint": None,
    }
    weights = plain_state_dict(h.model) if lead or _sharded(h.model) else {}  # fsdp: every rank gathers
    if lead:
        summary["checkpoint"] = _save(weights, summary, out / f"{name}.pt")
        say(f"[{name}] checkpoint: {summary['checkpoint']}")
    return summary


def _sharded(model: torch.nn.Module) -> bool:
    return is_sharded(model)


def _save(weights: dict[str, torch.Tensor], summary: dict[str, Any], path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")  # a crash mid-save leaves the old checkpoint whole
    torch.save(
        {"model": weights, "config": summary["config"], "epochs": summary["epochs"], "history": summary["history"]}, tmp
    )
    os.replace(tmp, path)
    return str(path)


def run_config(cfg: TrialConfig, epochs: int, out: Path, name: str, say: Say) -> dict[str, Any]:
    """Each run in a fresh process, as a user's training script would be: neither run inherits the other's
    warm state (threads, cudnn, allocator, kernel caches). gpus > 1: one process per device under torchrun."""
    if torch.cuda.is_available() and torch.cuda.device_count() < cfg.gpus and not ranks_share_gpus():
        raise AutotuneError(
            f"the config uses gpus={cfg.gpus} but this machine has {torch.cuda.device_count()} GPU(s) "
            f"(AUTOTUNE_DDP_BACKEND=gloo runs the ranks on shared GPUs: a check, not a speed)"
        )
    out.mkdir(parents=True, exist_ok=True)
    cfg_path, summary_path, error_path = (out / f"{name}{ext}" for ext in (".config.json", ".json", ".error"))
    for stale in (summary_path, error_path, *out.glob(f"{name}.failed.rank*.json")):
        stale.unlink(missing_ok=True)
    write_json_atomic(cfg_path, cfg.to_dict())
    cmd = [
        *python_for(cfg.gpus),
        "-m",
        "autotune.apply.train",
        "--config",
        str(cfg_path),
        "--epochs",
        str(epochs),
        "--out",
        str(out),
        "--name",
        name,
    ]
    if cfg.gpus > 1:
        say(f"[{name}] DDP over {cfg.gpus} processes: {' '.join(cmd[1:])}")
    code = run_process(cmd)  # its output to this terminal: the run's own progress lines
    if error_path.is_file():  # bad input found by the worker (e.g. no images in the data folder)
        raise AutotuneError(error_path.read_text().strip())
    if code != 0 or not summary_path.is_file():
        verdict = named_failure(read_verdicts(out.glob(f"{name}.failed.rank*.json")))
        if verdict is not None:
            raise TrainFailed(
                f"training {name} failed: {verdict['status']}: {verdict.get('message', '')}",
                exit_code_for(verdict["status"]),
            )
        raise TrainFailed(f"training {name} failed with exit code {code} (its output is above)", code or 1)
    return dict(json.loads(summary_path.read_text()))


def _rate(history: list[dict[str, Any]]) -> float | None:
    """samples/s over these epochs; None for none. Epochs after the first leave out one-off start-up
    (CUDA context, loader workers, cudnn.benchmark's autotuning of each new shape: 8 s of a 10 s first
    epoch on an H200), which a short run is dominated by and a long one is not."""
    seconds = sum(r["seconds"] for r in history)
    return sum(r["samples"] for r in history) / seconds if history and seconds > 0 else None


def train(
    cfg: TrialConfig,
    epochs: int,
    out: Path,
    compare_baseline: bool,
    say: Say,
    margin: float = METRIC_MARGIN,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Train the config (and, to compare, the baseline beside it, in `rounds` paired rounds), each run in
    its own process; print the speedup, the optimizer steps and both final metrics (and over several
    rounds, each round's ratio, their median and range), and write train.json. Raises TrainFailed or
    AutotuneError."""
    if not compare_baseline:
        results = [run_config(cfg, epochs, out, "config", say)]
    else:
        results, pairs = [], []
        for k in range(rounds):
            # Alternate who goes first: what a first run warms for the second (the OS page cache) and slow
            # drift of the machine's speed then favour neither side. Round 1 starts with the config.
            suffix = "" if k == 0 else f"-{k + 1}"
            sides = [("config", cfg), ("baseline", baseline_of(cfg))]
            done = {
                name: run_config(c, epochs, out, name + suffix, say)
                for name, c in (sides if k % 2 == 0 else sides[::-1])
            }
            lines = compare(done["config"], done["baseline"], epochs, margin)
            if k == 0:  # the full comparison once; the rounds' spread below
                for line in lines:
                    say(line)
            pairs.append((done["config"], done["baseline"]))
            results += [done["config"], done["baseline"]]
        summary, lines = paired(pairs)
        for line in lines:
            say(line)
        results[0]["comparison"]["paired"] = summary
    write_json_atomic(out / "train.json", results)
    say(f"autotune: results in {out / 'train.json'}")
    return results


def main(argv: list[str] | None = None) -> int:
    """The worker: one training run (one rank of it under torchrun), started by run_config."""
    p = argparse.ArgumentParser(prog="python -m autotune.apply.train", description="one run of autotune train")
    p.add_argument("--config", required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--name", required=True)
    args = p.parse_args(argv)
    die_with_parent()
    rank = int(os.environ.get("RANK", 0))
    console = Console()
    say: Say = (
        (lambda s: console.print(s, highlight=False, markup=False, soft_wrap=True)) if rank == 0 else (lambda s: None)
    )
    try:
        summary = train_one(load_config(args.config), args.epochs, args.out, args.name, say)
    except Exception as e:
        status, message = status_of(e)
        if status in TRACEBACK_WORTHY:
            traceback.print_exc()  # kept in the output, above the one line
        return _fail(args.out, args.name, status, message)
    if rank == 0:
        write_json_atomic(args.out / f"{args.name}.json", summary)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return ExitCode.OK


def _verdict_path(out: Path, name: str, rank: int) -> Path:
    return out / f"{name}.failed.rank{rank}.json"


def _fail(out: Path, name: str, status: str, message: str) -> int:
    """Leave this rank's verdict for run_config, then end. Under torchrun the verdict is the only way the
    cause gets out (torchrun exits 1 whatever the rank's code), and the rank ends with os._exit: returning
    normally would leave NCCL alive and the peers blocked in a collective until torchrun reaps them."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if status in (Reason.BAD_CONFIG, Reason.DATA):  # bad input: the parent reports it as one line, exit 2
        write_atomic(out / f"{name}.error", message)
    write_json_atomic(_verdict_path(out, name, rank), {"status": status, "message": message})
    print(f"autotune train: {name}: {status}: {message}", file=sys.stderr)
    code = exit_code_for(status)
    if world > 1:
        exit_now(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
