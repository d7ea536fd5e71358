"""`autotune ablate`: a measured waterfall, automated. Greedy: from the baseline, add the best config's
techniques one at a time, each step keeping the one that helps most, every candidate a real measured trial."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from collections.abc import Callable

from rich.table import Table
from rich.text import Text

from autotune.core.config import BASELINE, KNOBS, LEADS, TrialConfig, dependents
from autotune.core.errors import AutotuneError, ConfigError, TrialFailure
from autotune.core.outcomes import Role
from autotune.search.loop.study import study_workload
from autotune.search.space.machine import differences, fingerprint
from autotune.search.store.records import StudyRecord, TrialRecord, write_ablation
from autotune.search.store.results import leaderboard
from autotune.trial.processes import launcher
from autotune.trial.processes.locks import device_lock

# A knob that means nothing without another (the loader's without workers, FSDP's without fsdp) travels
# with the knob it waits on, first in its group.
GROUPS = tuple((LEADS[needs], *dependents(needs)) for needs in ("workers", "fsdp"))

Technique = dict[str, Any]  # knob -> value; one or more knobs switched together


def techniques(base: TrialConfig, best: TrialConfig) -> list[Technique]:
    """The best config's knobs that differ from the baseline, loader knobs grouped with num_workers, FSDP's
    with parallel."""
    diff = {k: getattr(best, k) for k in KNOBS if getattr(best, k) != getattr(base, k)}
    out: list[Technique] = []
    for group in GROUPS:
        if group[0] in diff:
            out.append({k: getattr(best, k) for k in group if k == group[0] or k in diff})
            diff = {k: v for k, v in diff.items() if k not in group}
    out += [{k: v} for k, v in diff.items()]
    return out


def label(t: Technique) -> str:
    first, *rest = t.items()
    text = f"{first[0]}={first[1]}"
    return text + (f" (+{', '.join(f'{k}={v}' for k, v in rest)})" if rest else "")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9=._-]+", "_", text)[:60].strip("_")


Measure = Callable[[TrialConfig, str], float]  # (config, name) -> samples/s; raises TrialFailure


def greedy(
    base: TrialConfig, todo: list[Technique], measure: Measure, say: Callable[[str], None] = lambda s: None
) -> list[dict[str, Any]]:
    """Step 0 measures the baseline; each later step adds the remaining technique that helps most."""
    sps0 = measure(base, "step-0-baseline")
    steps = [
        {
            "step": 0,
            "technique": "baseline",
            "knobs": {},
            "samples_per_s": sps0,
            "gain": 0.0,
            "speedup": 1.0,
            "config": base.knobs(),
            "tried": [],
        }
    ]
    say(f"step 0: baseline {sps0:.2f} samples/s")
    current, prev, todo = base, sps0, list(todo)
    while todo:
        tried: list[dict[str, Any]] = []
        best: tuple[float, Technique, TrialConfig] | None = None
        for t in todo:
            name = f"step-{len(steps)}-{_slug(label(t))}"
            try:
                cfg = current.replace(**t)
            except ConfigError as e:  # an invalid combination here; it may become valid after another step
                tried.append({"technique": label(t), "samples_per_s": None, "reason": f"invalid: {e}"})
                continue
            try:
                sps = measure(cfg, name)
            except TrialFailure as e:  # e.g. a batch size that only fits once checkpointing is on
                tried.append({"technique": label(t), "samples_per_s": None, "reason": f"{e.reason}: {str(e)[:200]}"})
                say(f"  + {label(t)}: {e.reason}")
                continue
            tried.append({"technique": label(t), "samples_per_s": sps})
            say(f"  + {label(t)}: {sps:.2f} samples/s")
            if best is None or sps > best[0]:
                best = (sps, t, cfg)
        if best is None:
            say(f"step {len(steps)}: every remaining technique failed; stopping")
            steps[-1]["unapplied"] = [label(t) for t in todo]
            break
        sps, t, current = best
        steps.append(
            {
                "step": len(steps),
                "technique": label(t),
                "knobs": dict(t),
                "samples_per_s": sps,
                "gain": sps - prev,
                "speedup": sps / sps0,
                "config": current.knobs(),
                "tried": tried,
            }
        )
        say(f"step {len(steps) - 1}: kept {label(t)} -> {sps:.2f} samples/s, x{sps / sps0:.2f}")
        prev = sps
        todo.remove(t)
    return steps


def _configs(study: Any, studies_dir: str, data: str | None, seconds: float | None) -> tuple[TrialConfig, TrialConfig]:
    """(baseline, best) from the study, on its workload (with --data / --seconds applied)."""
    work = study_workload(study, data, studies_dir)
    if seconds:
        work = work.replace(seconds=seconds)
    board = leaderboard(study)
    if not board:
        raise AutotuneError(f"study {study.study_name!r} has no finished feasible trial to ablate")
    records = [TrialRecord.from_frozen(t) for t in study.trials]
    base_knobs = next((r.config for r in records if r.role == Role.BASELINE and r.config), BASELINE.knobs())
    return work.replace(**base_knobs), TrialRecord.from_frozen(board[0]).knobs(work)


def run_ablation(
    study: Any,
    studies_dir: str,
    say: Callable[[str], None],
    *,
    data: str | None = None,
    seconds: float | None = None,
    trial_timeout: float | None = None,
) -> list[dict[str, Any]]:
    base, best = _configs(study, studies_dir, data, seconds)
    diff = differences(StudyRecord.of(study).fingerprint, fingerprint(base))
    if diff:  # every step is re-measured here, so the ablation is self-consistent; the study's figures are not
        say(f"note: this machine differs from the study's ({'; '.join(diff)}); all steps are measured here")
    todo = techniques(base, best)
    if not todo:
        raise AutotuneError(f"the best trial of {study.study_name!r} is the baseline config: nothing to ablate")
    out_dir = Path(studies_dir) / study.study_name / "ablation"
    timeout = trial_timeout or max(300.0, 20 * (base.seconds or 15))

    def measure(cfg: TrialConfig, name: str) -> float:
        with device_lock(cfg.gpus) as lease:
            result = launcher.run_trial(cfg, out_dir / name, timeout)
        if lease.contended:
            say(f"  note: another trial shared the CPU during {name}; its timing is suspect")
        return float(result.samples_per_s or 0.0)

    n = len(todo)
    say(
        f"ablating {n} technique(s): {'; '.join(label(t) for t in todo)} "
        f"({1 + n * (n + 1) // 2} trials at most, {base.seconds or base.timed_steps} "
        f"{'s' if base.seconds else 'steps'} measured each)"
    )
    steps = greedy(base, todo, measure, say)
    write_ablation(study, steps)
    return steps


def table(steps: list[dict[str, Any]], title: str) -> Any:
    t = Table(title=title)
    for col in ("step", "technique", "samples/s", "gain", "speedup"):
        t.add_column(col, justify="left" if col == "technique" else "right")
    for s in steps:
        t.add_row(
            str(s["step"]),
            Text(s["technique"]),
            f"{s['samples_per_s']:.2f}",
            "-" if s["step"] == 0 else f"{s['gain']:+.2f}",
            f"x{s['speedup']:.2f}",
        )
    return t
