"""The live view of a running search (rich), and the leaderboard table."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

import optuna
from optuna.trial import FrozenTrial
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.apply.fit_table import FitTable
from autotune.core.config import BASELINE, TrialConfig
from autotune.core.paired import Paired
from autotune.core.training import shown
from autotune.core.outcomes import Outcome, Reason, Role, Verdict
from autotune.search.store import records
from autotune.search.budget import Budget
from autotune.search.store.records import TrialRecord
from autotune.search.loop import export_ceiling
from autotune.search.store.results import (
    BaselineKnobs,
    baseline_figures,
    baseline_knobs,
    baseline_sps,
    baseline_spread,
    class_check,
    confirmed_paired,
    exported,
    feasible,
    final,
    leaderboard,
)
from autotune.search.loop.runner import Events


def knob_summary(config: Mapping[str, Any], base: BaselineKnobs | None = None) -> str:
    """What a trial changes from the baseline the study ran (`base`: the script's own values, not autotune's
    defaults; plain PyTorch without one): that is what the reader needs to apply. A config equal to the
    baseline's runs the job as written: "(baseline)"."""
    written = BASELINE.knobs() if base is None else base.config
    ran = written if base is None else base.ran
    if all(config.get(k) == v for k, v in written.items() if k in config):
        return "(baseline)"
    return " ".join(f"{k}={v}" for k, v in config.items() if k in ran and v != ran[k]) or "(baseline)"


class LiveSearch:
    """One status panel that updates per throughput window, plus one printed line per finished trial."""

    def __init__(self, study: optuna.Study, budget: Budget | None, console: Console) -> None:
        self.study, self.console = study, console
        self.budget = budget  # the run's own clock: the panel shows what the session counts down
        self.current = "starting"
        self.current_sps: float | None = None
        self.live = Live(self._render(), console=console, refresh_per_second=2, transient=True)

    def events(self) -> Events:
        return Events(started=self.started, window=self.window, finished=self.finished)

    def __enter__(self) -> LiveSearch:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)

    def started(self, number: int, role: str, cfg: TrialConfig) -> None:
        running = knob_summary(cfg.knobs(), baseline_knobs(self.study))
        self.current, self.current_sps = f"trial {number} ({role}) running: {running}", None
        self.live.update(self._render())

    def window(self, sps: float) -> None:
        self.current_sps = sps
        self.live.update(self._render())

    def finished(self, t: FrozenTrial) -> None:
        r, outcome = TrialRecord.from_frozen(t), records.outcome(t)
        why = r.message[:80] if r.reason in (None, outcome) else f"{r.reason}: {r.message[:80]}"
        figure = f"{t.value:8.2f} {records.unit_of(r.applied)}" if feasible(t) else f"{outcome}: {why}"
        speed = f"  x{r.speedup:.2f}" if feasible(t) and r.speedup else ""
        if outcome == Outcome.CONTENDED:
            others = r.metrics.get("others_cpu")
            busy = f"other processes kept {others:.2f} CPUs busy" if others else "another trial shared the CPU"
            speed += f"  [contended: {busy}; timing suspect, measured again]"
        if outcome == Outcome.REUSED:
            speed += f"  [same config as trial {r.repeat_of}: its figure reused, not run again]"
        if feasible(t) and r.reason == Reason.HEADROOM:  # the baseline, kept as the reference: say why it is risky
            speed += f"  [{r.message}]"
        if feasible(t) and r.training_math:
            speed += f"  [trains differently: {shown(r.training_math)}]"
        if r.cost_estimate_s is not None and r.wall_s is not None:
            speed += f"  [time: estimated {r.cost_estimate_s:.0f} s, took {r.wall_s:.0f} s]"
        self.console.print(
            f"trial {t.number:3d} [{r.role:10s}] {figure}{speed}  {knob_summary(r.config, baseline_knobs(self.study))}",
            highlight=False,
            markup=False,
        )
        self.current = "choosing the next trial"
        self.live.update(self._render())

    def _render(self) -> Table:
        trials = self.study.get_trials(deepcopy=False)
        outcomes = [records.outcome(t) for t in trials]
        done = sum(feasible(t) for t in trials)
        failed = sum(o.unsuccessful for o in outcomes)
        pruned = outcomes.count(Outcome.PRUNED)
        board = leaderboard(self.study)
        unit = records.throughput_unit(self.study)
        best = f"{board[0].value:.2f} {unit} (trial {board[0].number})" if board else "-"
        speedup = TrialRecord.from_frozen(board[0]).speedup if board else None
        if speedup:
            best += f", x{speedup:.2f} vs baseline"
        left_s = self.budget.left_s() if self.budget is not None else None
        left = None if left_s is None else int(left_s)
        grid = Table.grid(padding=(0, 2))
        grid.add_row(Text("now", style="bold"), self.current)
        grid.add_row(Text("current", style="bold"), f"{self.current_sps:.2f} {unit}" if self.current_sps else "-")
        grid.add_row(Text("best", style="bold"), best)
        grid.add_row(Text("trials", style="bold"), f"{done} done, {failed} failed, {pruned} pruned")
        grid.add_row(Text("time left", style="bold"), "no limit" if left is None else f"{left // 60}m{left % 60:02d}s")
        return grid


LEADERBOARD_COLUMNS = ("#", "trial", "role", "samples/s", "speedup", "peak MiB", "data wait", "training math", "config")


def in_unit(columns: tuple[str, ...], unit: str) -> tuple[str, ...]:
    """Column headings with the study's throughput unit (records.throughput_unit) for samples/s."""
    return tuple(c.replace(records.SAMPLES_PER_S, unit) for c in columns)


# Free text that runs long: printed under its row where the table does not fit the width.
LONG_COLUMNS = ("training math", "config")


def leaderboard_rows(study: optuna.Study, top: int) -> list[tuple[str, ...]]:
    """The top feasible trials as text cells, one row each; the terminal and the HTML report show these."""
    rows: list[tuple[str, ...]] = []
    checks, base = records.gate_checks(study), baseline_knobs(study)
    for rank, t in enumerate(leaderboard(study)[:top], 1):
        r = TrialRecord.from_frozen(t)
        mem, wait = r.metrics.get("peak_memory_bytes"), r.metrics.get("data_wait_fraction")
        rows.append(
            (
                str(rank),
                str(t.number),
                r.role,
                f"{t.value:.2f}",
                f"x{r.speedup:.2f}" if r.speedup else "-",
                f"{mem / 2**20:.0f}" if mem else "-",
                f"{wait:.0%}" if wait is not None else "-",
                shown(r.training_math) + checked(checks.get(str(t.number)) or class_check(study, t)),
                knob_summary(r.config, base),
            )
        )
    return rows


def checked(check: Mapping[str, Any] | None) -> str:
    """A check's verdict in a cell: "; parity pass", or "; to target x1.50 (pass)" for a changed step; a check
    that did not run, by its own name: "; time to target not checked"."""
    if not check or not check.get("verdict"):
        return ""
    if check["verdict"] not in (Verdict.PASS, Verdict.FAIL):
        return f"; {check.get('kind') or 'parity'} {check['verdict']}"
    if check.get("kind") == "time to target":
        x = check.get("speedup_to_target")
        return f"; to target {f'x{x:.2f}' if x else 'not reached'} ({check['verdict']})"
    return f"; parity {check['verdict']}"


def leaderboard_table(study: optuna.Study, top: int = 10) -> FitTable:
    """The leaderboard at any width: a full table where it fits, else the training math and config
    under each trial's row (an 80-column terminal would otherwise wrap them a letter per line)."""
    n = len(study.trials)
    notes = [note for note in (noise_note(study), ceiling_note(study)) if note]
    return FitTable(
        f"study {study.study_name}: "
        + (f"top {top} of {n} trials" if n > top else f"{n} trials")
        + "".join(f"\n{note}" for note in notes),
        in_unit(LEADERBOARD_COLUMNS, records.throughput_unit(study)),
        leaderboard_rows(study, top),
        long=LONG_COLUMNS,
        left=("role",),
    )


def noise_note(study: optuna.Study) -> str | None:
    """The baseline's draws (search/loop/draws.py): their spread, this machine's run-to-run noise for one
    config, and when it exceeds the best gain the trials show, that they cannot tell the configs apart;
    None with one draw."""
    spread, base = baseline_spread(study), baseline_sps(study)
    if spread is None or base is None:
        return None
    lo, hi = spread
    said = f"baseline: {len(baseline_figures(study))} draws, speedups over their median; spread x{lo:.2f}..x{hi:.2f}"
    board = [t for t in leaderboard(study) if TrialRecord.from_frozen(t).role != Role.BASELINE]
    best = float(board[0].value or 0) / base if board else None
    if best is not None and hi / lo > best:
        said += (
            f", wider than the best gain the trials show (x{best:.2f}): they cannot tell these configs apart, "
            "confirmation's side-by-side rounds decide"
        )
    return said


def ceiling_note(study: optuna.Study) -> str | None:
    """One line on how far the exported config is from the limit (search/loop/export_ceiling.py); None when its
    ceiling was not measured."""
    best = exported(study)
    section = records.ceiling(study, best.number) if best is not None else None
    if section is None or best is None:
        return None
    return f"exported trial {best.number}, ceiling: {export_ceiling.summary(section)}"


# The cost estimate made before launch (search/loop/cost.py) beside the wall time each trial took.
COST_COLUMNS = ("trial", "role", "batch", "estimate s", "took s", "error")


def cost_rows(study: optuna.Study, top: int | None = None) -> list[tuple[str, ...]]:
    """One row of text cells per trial with a cost estimate, in trial order (`top`: the last ones only);
    error = (estimate - took) / took. A config not run on its estimate shows "not run" for what it took.
    The terminal (`show`) and the HTML report print these."""
    rows: list[tuple[str, ...]] = []
    for t in study.get_trials(deepcopy=False):
        r = TrialRecord.from_frozen(t)
        est, took = r.cost_estimate_s, r.wall_s
        if est is None or records.outcome(t) == Outcome.REUSED:  # its first trial's row says it
            continue
        error = f"{(est - took) / took:+.0%}" if took else "-"
        shown_took = (
            "not run" if records.outcome(t) == Outcome.WRITTEN_OFF else f"{took:.1f}" if took is not None else "-"
        )
        rows.append((str(t.number), r.role, batch_cell(r), f"{est:.1f}", shown_took, error))
    return rows[-top:] if top else rows


def cost_table(study: optuna.Study, top: int = 10) -> FitTable | None:
    """The cost estimate beside the measured wall time, last `top` trials; None when no trial has one."""
    rows = cost_rows(study, top)
    if not rows:
        return None
    return FitTable(
        f"time: estimate before launch vs wall time taken, last {len(rows)} trials", COST_COLUMNS, rows, left=("role",)
    )


# Short names: the seven fit 80 columns side by side (the heading says what "speedup" and "interval" are).
CONFIRMATION_COLUMNS = ("config", "search samples/s", "median", "min", "max", "speedup", "interval")


def confirmation_summary(study: optuna.Study) -> tuple[str, list[tuple[str, ...]]] | None:
    """(what was run, one row of text cells per config) for the terminal and the HTML report; None when
    the search was not confirmed."""
    summary = records.confirmation(study)
    if not summary:
        return None
    rows: list[tuple[str, ...]] = []
    for r in summary["rows"]:
        rows.append(
            (
                r["label"],
                _fig(r["search_samples_per_s"]),
                _fig(r["samples_per_s_median"]),
                _fig(r["min"]),
                _fig(r["max"]),
                "-" if r["speedup_median"] is None else f"x{r['speedup_median']:.2f}",
                _interval_cell(r),
            )
        )
    return (
        f"{summary['rounds']} interleaved round(s), each a fresh process; speedup: median of each round's "
        "ratio to the baseline beside it; interval: the sign test's for that median, with its coverage "
        f"(the baseline's: its rounds' spread); {_fastest(summary)}"
    ), rows


def _interval_cell(r: Mapping[str, Any]) -> str:
    """A config's sign-test interval and coverage; the baseline's row (or a record without ratios), its range."""
    ratios = r.get("ratios") or ()
    if r["label"] != "baseline" and ratios:
        p = Paired.of(ratios)
        return f"x{p.interval[0]:.2f} .. x{p.interval[1]:.2f} {p.coverage:.0%}"
    spread = r.get("speedup_range")
    return "-" if not spread else f"x{spread[0]:.2f} .. x{spread[1]:.2f}"


def _fastest(summary: records.ConfirmationSummary) -> str:
    """What the rounds say, as what it is: "faster" only for a config whose sign-test interval excludes
    x1.00 over at least 3 rounds (core/paired.py); without one, no change is exported (results.choose)."""
    rows = [r for r in summary["rows"] if r["label"] != "baseline" and r.get("speedup_median")]
    gained = sorted((r for r in rows if Paired.of_row(r).measurable), key=lambda r: -r["speedup_median"])
    if gained:
        return f"measurably faster: {gained[0]['label']}, {Paired.of_row(gained[0]).statement()}"
    if not rows:
        return "no config was measured in a round"
    best = max(rows, key=lambda r: (len(r.get("ratios") or ()), r["speedup_median"]))  # more rounds first
    return (
        f"none measurably faster than the baseline (best by median: {best['label']}, {Paired.of_row(best).statement()})"
    )


def _fig(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def confirmation_table(study: optuna.Study) -> FitTable | None:
    """The confirmation rounds (median, range, speedup: the median per-round ratio to the baseline), or None."""
    confirmed = confirmation_summary(study)
    if confirmed is None:
        return None
    heading, rows = confirmed
    columns = in_unit(CONFIRMATION_COLUMNS, records.throughput_unit(study))
    return FitTable(f"confirmed: {heading}", columns, rows, left=("config",))


def order_note(study: optuna.Study) -> str | None:
    """One line when confirmation reordered the search's top configs, else None."""
    summary = records.confirmation(study)
    if not summary or not summary.get("order_changed"):
        return None
    return (
        f"confirmation changed the order: the search ranked {', '.join(summary['search_order'])}; "
        f"re-measured side by side: {', '.join(summary['confirmed_order'])}"
    )


def export_notes(study: optuna.Study) -> list[str]:
    """The final lines on what was exported: what its confirmation rounds say (or that the baseline was
    kept), and each faster config it was chosen over, with why (best.yaml's `passed_over:`), one whose
    training math was not checked last: its why names the budget that would pay for the check."""
    choice = final(study)
    best = choice.trial
    if best is None:
        return []
    lines = []
    if records.confirmation(study) is not None:
        rounds = confirmed_paired(study, best.number)
        if TrialRecord.from_frozen(best).role == Role.BASELINE:
            lines.append("no change exported: the export is the baseline's own config")
        elif rounds is not None:
            lines.append(f"the exported trial {best.number}: {rounds.statement()}")
    # An unchecked faster class last: its reason ends with the budget that would pay for its check.
    for p in sorted(choice.passed_over, key=lambda p: str(p["why"]).startswith("its training math")):
        speed = f" (x{p['speedup']:.2f})" if p.get("speedup") else ""
        lines.append(f"trial {p['trial']}{speed} was faster but is not exported: {p['why']}")
    return lines


def training_note(study: optuna.Study) -> str:
    """One line on the exported config: the same training as the baseline, or how it differs, what
    parity measured, and what to do."""
    best = exported(study)
    if best is None:
        return "nothing exported"
    r = TrialRecord.from_frozen(best)
    check = records.gate_check(study, best.number) or class_check(study, best)
    said = f"{checked(check)[2:]} ({check.get('reason', '')})" if check else ""
    said = f"; {said}" if said else ""
    if r.training_math == ():
        return f"the exported trial {best.number} computes the baseline's training{said}"
    if r.training_math is None:
        return f"the exported trial {best.number}: training math unknown{said}"
    proven = check is not None and check.get("kind") == "time to target" and check.get("verdict") == Verdict.PASS
    return f"the exported trial {best.number} trains differently from the baseline: {shown(r.training_math)}{said}" + (
        "; to keep the baseline's optimizer step, search with --global-batch"
        if not proven and any(c.startswith("global batch") for c in r.training_math)
        else ""
    )


def batch_cell(r: TrialRecord) -> str:
    """The micro-batch a trial ran, for the fit tables; "-" for a record without knobs."""
    return str(r.config_for(BASELINE).batch_size) if r.config else "-"
