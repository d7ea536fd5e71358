"""What trial 0, the baseline, teaches a study about the rest of its search, read from its record:
  - how long a throughput window must be: at least about WINDOW_S and MIN_WINDOW steps, whichever is
    longer, at the step time trial 0 measured, so no trial is pruned on windows too short to measure (a
    script's 1.7 ms steps made 3-step windows of 5 ms, and most of its trials were pruned on them);
and what trial 0, the script run as written, teaches a script study (its `applied`):
  - the batch the script ran, where its source could not say it (at.batch_size() of a name a configurator
    or a config file sets, a DataLoader's computed batch): the study is rebased on it and the space resolved
    again, so the batch is searched from here (or kept, at the one that ran);
  - DataLoaders that all load an IterableDataset, which every trial leaves as the script built them: the
    loader knobs are fixed from here, so no trial is spent on what cannot change.
Each lesson is said; the session runs the rest of the search on what they return.

May import: autotune.core, autotune.pipelines, and the rest of autotune.search.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from autotune import pipelines
from autotune.pipelines import script as script_job
from autotune.core.config import TrialConfig, baseline_of
from autotune.core.settings import SearchSettings
from autotune.search.space.reading import load_space
from autotune.search.space.resolve import batch_said, loaders_kept, model_kept, rebased, resolve
from autotune.search.space.spec import DEFAULT_SPACE, SearchSpace
from autotune.search.store.records import TrialRecord

Say = Callable[[str], None]


def lessons(
    settings: SearchSettings, space: SearchSpace, trial0: TrialRecord, say: Say
) -> tuple[SearchSettings, SearchSpace] | None:
    """The settings and space the rest of the search runs on, after trial 0's record; None: as they are."""
    widened = window(settings, trial0.metrics, say)
    learned = script_lessons(widened or settings, space, trial0.applied, say)
    return learned or ((widened, space) if widened else None)


# A throughput window lasts at least about this long, and this many steps: shorter ones measure noise.
WINDOW_S = 1.0
MIN_WINDOW = 3


def window(settings: SearchSettings, metrics: Mapping[str, Any], say: Say) -> SearchSettings | None:
    """The settings with windows of at least WINDOW_S at trial 0's step time (and MIN_WINDOW steps), where
    the study's are shorter; None: they are long enough, or trial 0 measured no step time."""
    step = metrics.get("step_time_p50")
    if not isinstance(step, (int, float)) or step <= 0:
        return None
    steps = max(MIN_WINDOW, math.ceil(WINDOW_S / step))
    if settings.base.seconds is None:  # a trial of a fixed step count: no window longer than its steps
        steps = min(steps, settings.base.timed_steps)
    if steps <= settings.base.window:
        return None
    say(
        f"windows: {steps} steps each from here (trial 0's steps take {step * 1000:.3g} ms; a window of "
        f"{settings.base.window} would last {settings.base.window * step * 1000:.3g} ms, too short to measure or prune on)"
    )
    return dataclasses.replace(settings, base=settings.base.replace(window=steps))


def script_lessons(
    settings: SearchSettings, space: SearchSpace, applied: Mapping[str, Any], say: Say
) -> tuple[SearchSettings, SearchSpace] | None:
    """What trial 0's `applied` teaches a script study; None: nothing (or not a script study)."""
    if not pipelines.kind_of(settings.base.pipeline).learns_from_trial0:
        return None
    rebase = own_batch(settings, space, applied, say)
    after_settings, after_space = rebase or (settings, space)
    kept, fixed = loaders_kept(after_space, after_settings.base, applied)
    if fixed:
        say(
            f"space: {', '.join(fixed)} not searched from here: every DataLoader trial 0 built loads an "
            "IterableDataset, whose workers the script keeps (more would yield its stream once per worker)"
        )
    kept, why = model_kept(kept, after_settings.base, applied)
    for knob, reason in why.items():
        say(f"space: {knob} not searched from here: {reason}")
    return (after_settings, kept) if fixed or why else rebase


def own_batch(
    settings: SearchSettings, space: SearchSpace, applied: Mapping[str, Any], say: Say
) -> tuple[SearchSettings, SearchSpace] | None:
    """The study rebased on the batch, accumulation and lr trial 0 ran, where its workload did not record
    them, and the space resolved again on it; None where nothing changes."""
    base = rebased(settings.base, applied)
    if base is None:
        return None
    quiet = lambda line: say(line) if batch_said(line) else None  # noqa: E731
    again, _, _ = resolve(
        load_space(settings.space or DEFAULT_SPACE), pipelines.load_pipeline(base), settings, base, quiet
    )
    new = sorted(set(again.searched()) - set(space.searched()))
    before = dict(settings.base.baseline or ())
    changed = [f"{k} {v}" for k, v in dict(base.baseline or ()).items() if before.get(k) != v]
    if base.own_accumulation != settings.base.own_accumulation:
        changed.append(f"accumulation {base.own_accumulation} (global batch {baseline_of(base).global_batch_size})")
    if base.lr != settings.base.lr:
        changed.append(f"lr {base.lr:.4g}")
    gone = sorted(set(space.searched()) - set(again.searched()))
    said = [k for k in new if not shown_opens(settings.base, base, k)] if changed else []
    if changed:
        say(
            f"baseline: trial 0 ran the script's own {', '.join(changed)}, which its source could not say"
            + (f": {', '.join(said)} searched from here" if said else ": kept, the script's own" if not new else "")
        )
    rest = [k for k in new if k not in said]
    if rest or gone or base.lr_scaling != settings.base.lr_scaling:
        say(shown_said(settings.base, base, rest, gone, pipelines.load_pipeline(base)))
    return dataclasses.replace(settings, base=base), again


def shown_opens(before: TrialConfig, after: TrialConfig, knob: str) -> bool:
    """Whether what the run showed (TrialConfig.shown) is what lets the script take `knob`."""
    if before.shown == after.shown:
        return False
    return knob in script_job.load(after.replace(shown=before.shown)).unsupported


def shown_said(before: TrialConfig, after: TrialConfig, new: list[str], gone: list[str], job: Any) -> str:
    """One line: what trial 0's run showed of the script, and the knobs that follow it from here."""
    shown = dict(after.shown or ())
    said = [
        f"{shown.get('loaders', 0)} DataLoader(s) built",
        f"optimizer {', '.join(shown.get('optimizers') or ()) or 'none'} stepped",
        f"{'its own' if shown.get('own_group') else 'no'} process group",
    ]
    line = f"space: trial 0's run showed {'; '.join(said)} (wherever it built them; its source was a first guess)"
    if new:
        line += f": {', '.join(new)} searched from here"
    why = getattr(getattr(job, "unsupported", None), "why", {})
    if gone:
        line += "; " + ", ".join(f"{k} not searched from here ({why.get(k, 'the run shows it')})" for k in gone)
    if after.lr_scaling != before.lr_scaling:
        line += f"; lr rule {before.lr_scaling} -> {after.lr_scaling} ({getattr(job, 'lr_rule_why', '')})"
    return line
