"""One run of a user's script alone, as `python train.py ARGS` runs it, timed without editing it.

`python -m autotune.trial.probes.alone --script FILE [--home DIR ...] --warmup W --steps N --out R -- ARGS`
runs FILE with runpy as `__main__` (sys.argv = [FILE, *ARGS], the DIRs first on sys.path, in order: the
folder `python` would put there; for a patched copy kept elsewhere, the copy's folder, where the modules
the diff edits are, then the original script's, for the rest), in a fresh process
with no trial around it: no knob seams, no at.* trial installed, so every at.* call is the identity and
the script runs its own settings. Only the Clock trials drive is installed (trial.measurement.clock, with a
Span of W warm-up and N timed steps and no meters: it counts and times, and changes nothing the script
runs), driven from torch's global optimizer step post-hook: the first step's end begins it (where a step
starts in a script is not seen), the next W steps are its warm-up, the N after them are timed, each read
after a device sync; then the clock raises WindowOver, a BaseException the script's own
`except Exception` lets through, which ends the run. Samples are what the script's own DataLoaders
handed over during the timed steps, counted as a trial counts them (trial.measurement.samples), so a
change of batch is counted as it ran; a script whose batches come from no DataLoader is measured in
steps/s, and the result says which unit.

R holds steps_per_s, samples_per_s (None without a counted loader), unit, the timed seconds, samples, the
batch size each DataLoader was built with and the thread count. Exit 0; 1 the script ended (or raised)
before W + N + 1 steps.

`run_alone` starts one such process (search/loop/alone.py alternates them in paired rounds;
benchmarks/script_example.py measures a search's export the same way).

May import: autotune.core, trial.processes, trial.loop and trial.measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autotune.core.errors import TrialTimeout

UNIT_SAMPLES, UNIT_STEPS = "samples/s", "steps/s"


class AloneFailed(Exception):
    """The run did not measure its steps (the script failed or ended early): its log's last lines say why."""


def command(
    script: Path,
    args: list[str],
    warmup: int,
    steps: int,
    out: Path,
    home: tuple[Path, ...] = (),
    model: Path | None = None,
) -> list[str]:
    """The argv of one alone run of `script` (with the `home` folders first on sys.path: default its own;
    `model`: a config whose model knobs the run applies, as `autotune run` does)."""
    cmd = [sys.executable, "-m", "autotune.trial.probes.alone", "--script", str(script), "--out", str(out)]
    cmd += ["--warmup", str(warmup), "--steps", str(steps)]
    for folder in home:
        cmd += ["--home", str(folder)]
    if model is not None:
        cmd += ["--model", str(model)]
    return [*cmd, "--", *args]


def run_alone(
    script: Path,
    args: list[str],
    warmup: int,
    steps: int,
    out: Path,
    *,
    home: tuple[Path, ...] = (),
    timeout_s: float | None = None,
    model: Path | None = None,
) -> dict[str, Any]:
    """One alone run in a fresh process (its log beside `out`, as out's stem + .log); its figures, or
    AloneFailed with the log's tail. The process runs in this process's folder and environment, as the
    trials do, so the script's relative paths mean what they mean to them."""
    from autotune.trial.processes.launcher import run_process, tail

    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    log = out.with_suffix(".log")
    try:
        code = run_process(command(script, args, warmup, steps, out, home, model), log, timeout_s)
    except TrialTimeout as e:
        raise AloneFailed(f"{script.name}: {e}") from None
    if code != 0 or not out.is_file():
        raise AloneFailed(f"{script.name} exited with code {code}; its log ({log}) ends:\n{tail(log, 8)}")
    return dict(json.loads(out.read_text()))


class _Run:
    """What one alone run saw: its clock (a Span of `warmup` then `steps` timed steps, without the trial's
    meters: it only counts and times), the optimizer steps the script took, and the batch size each
    DataLoader was built with."""

    def __init__(self, warmup: int, steps: int) -> None:
        from autotune.trial.measurement.clock import Clock, Span  # not at import: the search needs no torch

        self.clock = Clock(Span(warmup, steps, meters=False), _device())
        self.steps = 0  # optimizer steps, the first (which started the clock) included
        self.batch_sizes: list[Any] = []

    def step_end(self) -> None:
        """An optimizer step finished. Where a step starts in a script is not seen, so the first step's end
        begins the clock (the script's start-up and first step are no warm-up step of it); WindowOver once
        the timed steps are done, which ends the script."""
        self.steps += 1
        if self.steps == 1:
            self.clock.begin()
        else:
            self.clock.step_end()
        self.clock.raise_if_over()


def measure(
    script: Path, args: list[str], warmup: int, steps: int, home: tuple[Path, ...] = (), model: Path | None = None
) -> dict[str, Any]:
    """Run `script` in this process as `python script ARGS` would, timing its optimizer steps; its figures.
    `model`: a config JSON ({"config", "routed"}) whose model knobs are applied to the model the script's
    optimizer trains, as `autotune run` applies them (trial/loop/script/model.py): what no diff can write.
    Raises AloneFailed when it ends before warmup + steps + 1 steps."""
    run = _Run(warmup, steps)
    seams = _model_seams(model)
    try:
        _run_counted(script, args, home or (script.parent,), run, seams)
    finally:
        if seams is not None:
            seams.close()
    if not run.clock.over:
        raise AloneFailed(
            f"the script ended after {run.steps} optimizer step(s), before the {warmup} warm-up and "
            f"{steps} timed ones: give it more steps in its arguments"
        )
    return _figures(run, warmup, steps) | ({"model": _model_effects(seams)} if seams is not None else {})


def _device() -> Any:
    """The device the clock synchronizes before reading: CUDA's current one (whichever the script set when
    the clock reads), else the CPU."""
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _model_effects(seams: Any) -> dict[str, Any]:
    """Each model knob as the copy's run showed it, recorded against the config applied."""
    from autotune.core.effects import effects

    return effects(seams.cfg, seams.knobs_seen())


def _model_seams(model: Path | None) -> Any:
    """The model seams of the config in `model` (None: none), applied as a trial's are."""
    if model is None:
        return None
    from autotune.core.config import TrialConfig
    from autotune.trial.loop.script.model import ModelSeams

    record = json.loads(model.read_text())
    return ModelSeams(TrialConfig.from_dict(record["config"]), record["routed"], as_written=False)


def _run_counted(script: Path, args: list[str], home: tuple[Path, ...], run: _Run, seams: Any = None) -> None:
    """Run `script` as `__main__` with the run's clock driven from torch's global optimizer step post-hook
    and the DataLoaders' batches told to it (and the model `seams`, armed by each optimizer the script
    builds), until it ends or the clock's window is over; sys.argv, sys.path and torch as they were
    afterwards."""
    import runpy

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from autotune.trial.measurement.clock import WindowOver

    init, nxt, build = DataLoader.__init__, _BaseDataLoaderIter.__next__, torch.optim.Optimizer.__init__

    def arming_init(optimizer: Any, *a: Any, **kw: Any) -> None:
        build(optimizer, *a, **kw)
        seams.arm(optimizer)

    def counting_init(loader: Any, *a: Any, **kw: Any) -> None:
        init(loader, *a, **kw)
        run.batch_sizes.append(loader.batch_size)

    def counting_next(it: Any) -> Any:
        batch = nxt(it)
        run.clock.delivered(batch)
        return batch

    def stepped(optimizer: Any, a: Any, kw: Any) -> None:
        run.step_end()

    DataLoader.__init__ = counting_init  # type: ignore[method-assign,assignment]
    _BaseDataLoaderIter.__next__ = counting_next  # type: ignore[method-assign,assignment]
    if seams is not None:
        torch.optim.Optimizer.__init__ = arming_init  # type: ignore[method-assign,assignment]
    handle = register_optimizer_step_post_hook(stepped)
    argv, path = sys.argv[:], sys.path[:]
    sys.argv = [str(script), *args]
    sys.path[0:0] = [str(folder) for folder in home]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except WindowOver:
        pass
    finally:
        handle.remove()
        DataLoader.__init__, _BaseDataLoaderIter.__next__ = init, nxt  # type: ignore[method-assign]
        torch.optim.Optimizer.__init__ = build  # type: ignore[method-assign]
        sys.argv, sys.path[:] = argv, path


def _figures(run: _Run, warmup: int, steps: int) -> dict[str, Any]:
    """The timed window's figures, as the clock measured them: steps/s, and samples/s where a DataLoader
    handed over batches."""
    import torch

    seconds, samples = run.clock.seconds, run.clock.samples
    assert seconds is not None  # the window is over
    return {
        "steps_per_s": steps / seconds,
        "samples_per_s": samples / seconds if samples is not None else None,
        "unit": UNIT_SAMPLES if samples is not None else UNIT_STEPS,
        "seconds": seconds,
        "steps": steps,
        "warmup": warmup,
        "samples": samples,
        "batch_sizes": run.batch_sizes,
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autotune.trial.probes.alone", description=__doc__.split("\n\n")[0])
    p.add_argument("--script", required=True, type=Path, help="the script to run as __main__")
    p.add_argument(
        "--home",
        type=Path,
        action="append",
        default=[],
        help="first on sys.path, in order (default: the script's folder)",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps (default 3)")
    p.add_argument("--steps", type=int, required=True, help="timed optimizer steps")
    p.add_argument("--out", required=True, type=Path, help="the figures' JSON")
    p.add_argument("--model", type=Path, help="a config JSON whose model knobs to apply, as `autotune run` does")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments, after --")
    a = p.parse_args(argv)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    try:
        figures = measure(a.script.resolve(), args, a.warmup, a.steps, tuple(a.home), a.model)
    except AloneFailed as e:
        print(f"autotune alone: {e}", file=sys.stderr)
        return 1
    a.out.write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
