"""`autotune run --config best.yaml train.py ARGS`: the user's real training, with a script study's best.yaml
applied the way it was measured.

The script runs in this process as `python train.py ARGS` would run it, to its own end (its epochs, no
timed stop, no step limit), with the same seams a trial installs (trial/loop/script/seams.py: the DataLoader's
and the optimizer's arguments, zero_grad, cudnn and the threads, and the at.* calls handing over the
config's batch, precision, lr, model), and no edit to the script: what runs is what was measured, even
the knobs a diff cannot write (an optimizer built in another module, a value computed at run time). The
loader knobs go where the exported trial iterated a DataLoader (best.yaml's `sites:`), as the diff writes
them: a validation loader no trial measured keeps the script's own arguments. The trial's window is measured on the way, and the `applied` record a trial writes (each knob's requested
value beside the one in effect) is written to a JSON file, so the run can be checked against the trial;
after Ctrl-C too, with what ran so far (exit 130). A run is no trial: it says first what it applies from
best.yaml (the knobs that are not the script's own), its figure in the study's unit, and no trial's warm-up.

A config on several GPUs runs under torchrun, one process per rank, as the study's trials did:
`torchrun --nproc-per-node N -m autotune run --config best.yaml train.py ARGS`; rank 0 writes the file.

May import: autotune.core, autotune.search, autotune.trial, autotune.pipelines.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.core.config import TrialConfig
from autotune.core.configfile import load_config, load_sites
from autotune.core.errors import ConfigError, ExitCode
from autotune.core.files import write_json_atomic
from autotune.pipelines import kind_of, load_pipeline, script
from autotune.trial.loop.worker import unit_said

Say = Callable[[str], None]


def config_for(config: str | os.PathLike[str], path: str, args: list[str]) -> tuple[TrialConfig, str | None]:
    """best.yaml's config and workload, for `path ARGS` in place of the study's script and arguments, and a
    note when that script is not the one the study measured. Bad input (a file that is not a script
    study's export, a missing script, several GPUs without torchrun, a baseline the script cannot run) is
    one line (ConfigError, PipelineError)."""
    cfg = load_config(config)
    if not kind_of(cfg.pipeline).has_run_command:
        raise ConfigError(
            f"{config}: measured on {cfg.pipeline!r}, not a script (--pipeline script:...): "
            "autotune run trains a script study's export; `autotune train --config` trains a pipeline's"
        )
    spec = script.spec_of(path, args)
    if cfg.gpus > 1 and "WORLD_SIZE" not in os.environ:
        raise ConfigError(
            f"{config}: gpus {cfg.gpus}: run one process per GPU, as the trials did: "
            + shlex.join(
                [
                    "torchrun",
                    "--nproc-per-node",
                    str(cfg.gpus),
                    "-m",
                    "autotune",
                    "run",
                    "--config",
                    str(config),
                    path,
                    *args,
                ]
            )
        )
    studied, _ = script.parse(cfg.pipeline)
    ran, _ = script.parse(spec)
    note = None if Path(studied).resolve() == Path(ran) else f"{config} was measured on {studied}; applied to {ran}"
    applied = cfg.replace(pipeline=spec)
    load_pipeline(applied)  # its baseline checked here, as a search checks it before any trial
    return applied, note


def measured_loaders(config: str | os.PathLike[str]) -> frozenset[tuple[str, int]] | None:
    """Where the exported trial built the DataLoaders it iterated (file, line): the loader knobs are applied
    there only, as the diff writes them, so a validation loader no trial measured keeps the script's own.
    None (applied to every loader, as the trials did) when best.yaml has no sites (a study made before
    they were recorded)."""
    sites = load_sites(config)
    if sites is None:
        return None
    loaders = [s for s in sites.get("loaders") or () if isinstance(s, dict)]
    return frozenset((str(s.get("file")), int(s.get("line") or 0)) for s in loaders if s.get("iterated"))


def applying(cfg: TrialConfig, source: str) -> str:
    """What a run applies from `source` (best.yaml), knob by knob in the knob table's order: the knobs whose
    value is not the script's own (the study's baseline); a run applies nothing else."""
    changed = [f"{k} {_as_yaml(getattr(cfg, k))}" for k in cfg.changed]
    if not changed:
        return f"applying nothing from {source}: its config is the script's own, which runs as `python` runs it"
    return f"applying from {source}: {', '.join(changed)} (the rest as the script runs)"


def _as_yaml(value: Any) -> str:
    """A knob's value as best.yaml spells it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def run(
    cfg: TrialConfig,
    out: Path,
    say: Say,
    measured: frozenset[tuple[str, int]] | None = None,
    source: str = "best.yaml",
) -> int:
    """Train `cfg`'s script to its end with `cfg` applied through the trial's seams (the loader knobs at the
    `measured` DataLoaders only), said first (`source`: the file it came from); what was applied, and the
    trial's window measured on the way, written to `out` (rank 0), after Ctrl-C too (what ran so far, exit
    130). Returns the script's exit code."""
    from autotune.trial.loop.script.running import run_whole

    first = int(os.environ.get("RANK", 0)) == 0
    if first:
        say(f"autotune run: {applying(cfg, source)}")
    result, code = run_whole(cfg, time.time(), measured)
    if not first:
        return code
    record: dict[str, Any] = {
        "config": cfg.to_dict(),
        "exit_code": code,
        "applied": dict(result.applied),
        "measured": {k: v for k, v in result.to_dict().items() if k not in ("applied", "losses", "windows", "status")},
    }
    write_json_atomic(out, record)
    steps = (result.applied.get("script") or {}).get("optimizer_steps")
    figure = (  # in the unit the study counted: a script that hands over no batch is timed in optimizer steps
        f"the trial's window measured on the way: {result.samples_per_s:.2f} {unit_said(result.applied)}"
        if result.samples_per_s
        else f"too short to measure a trial's window ({result.message})"
    )
    stopped, so_far = ("interrupted after ", " so far") if code == ExitCode.INTERRUPTED else ("", "")
    say(
        f"autotune run: {stopped}{steps} optimizer step(s), exit code {code}; {figure}; "
        f"what was applied{so_far} -> {out}"
    )
    return code
