"""The live view of a running search (rich), and the leaderboard table."""
from __future__ import annotations

import time
from typing import Any, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.config import BASELINE, TrialConfig
from autotune.study import Events, baseline_sps, feasible, leaderboard



def knob_summary(config: dict[str, Any]) -> str:
    """Only what differs from the plain-PyTorch baseline: that is what the reader needs to apply."""
    changed = {k: v for k, v in config.items() if k in BASELINE.knobs() and v != getattr(BASELINE, k)}
    return " ".join(f"{k}={v}" for k, v in changed.items()) or "(baseline)"


class LiveSearch:
    """One status panel that updates per throughput window, plus one printed line per finished trial."""

    def __init__(self, study: optuna.Study, budget_s: float, console: Console) -> None:
        self.study, self.console = study, console
        self.deadline = time.monotonic() + budget_s
        self.current = "starting"
        self.current_sps: float | None = None
        self.live = Live(self._render(), console=console, refresh_per_second=2, transient=True)

    def events(self) -> Events:
        return Events(started=self.started, window=self.window, finished=self.finished)

    def __enter__(self) -> LiveSearch:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

    def started(self, number: int, role: str, cfg: TrialConfig) -> None:
        self.current, self.current_sps = f"trial {number} ({role}) running: {knob_summary(cfg.knobs())}", None
        self.live.update(self._render())

    def window(self, sps: float) -> None:
        self.current_sps = sps
        self.live.update(self._render())

    def finished(self, t: FrozenTrial) -> None:
        reason = t.user_attrs.get("reason")
        state = "infeasible" if t.state == TrialState.COMPLETE and not feasible(t) else t.state.name.lower()
        why = t.user_attrs.get("message", "")[:80] if reason in (None, state) else f"{reason}: {t.user_attrs.get('message', '')[:80]}"
        figure = f"{t.value:8.2f} samples/s" if feasible(t) else f"{state}: {why}"
        speed = f"  x{t.user_attrs['speedup']:.2f}" if feasible(t) and "speedup" in t.user_attrs else ""
        if t.user_attrs.get("contended"):
            speed += "  [contended: another trial shared the CPU, timing suspect]"
        self.console.print(f"trial {t.number:3d} [{t.user_attrs.get('role', 'search'):10s}] {figure}{speed}  "
                           f"{knob_summary(t.user_attrs.get('config', {}))}", highlight=False, markup=False)
        self.current = "choosing the next trial"
        self.live.update(self._render())

    def _render(self) -> Table:
        trials = self.study.get_trials(deepcopy=False)
        done = sum(feasible(t) for t in trials)
        failed = sum(t.state == TrialState.FAIL or (t.state == TrialState.COMPLETE and not feasible(t)) for t in trials)
        pruned = sum(t.state == TrialState.PRUNED for t in trials)
        board = leaderboard(self.study)
        base = baseline_sps(self.study)
        best = f"{board[0].value:.2f} samples/s (trial {board[0].number})" if board else "-"
        if board and base:
            best += f", x{float(board[0].value or 0) / base:.2f} vs baseline"
        left = max(0, int(self.deadline - time.monotonic()))
        grid = Table.grid(padding=(0, 2))
        grid.add_row(Text("now", style="bold"), self.current)
        grid.add_row(Text("current", style="bold"), f"{self.current_sps:.2f} samples/s" if self.current_sps else "-")
        grid.add_row(Text("best", style="bold"), best)
        grid.add_row(Text("trials", style="bold"), f"{done} done, {failed} failed, {pruned} pruned")
        grid.add_row(Text("time left", style="bold"), f"{left // 60}m{left % 60:02d}s")
        return grid


def leaderboard_table(study: optuna.Study, top: int = 10) -> Table:
    base = baseline_sps(study)
    table = Table(title=f"study {study.study_name}: top {top} of {len(study.trials)} trials")
    for col in ("#", "trial", "samples/s", "speedup", "peak MiB", "data wait", "config"):
        table.add_column(col, justify="left" if col == "config" else "right", no_wrap=col != "config")
    rows: Sequence[FrozenTrial] = leaderboard(study)[:top]
    for rank, t in enumerate(rows, 1):
        a = t.user_attrs
        table.add_row(str(rank), f"{t.number}{' (baseline)' if a.get('role') == 'baseline' else ''}",
                      f"{t.value:.2f}", f"x{float(t.value or 0) / base:.2f}" if base else "-",
                      f"{(a.get('peak_memory_bytes') or 0) / 2**20:.0f}",
                      f"{a['data_wait_fraction']:.0%}" if a.get("data_wait_fraction") is not None else "-",
                      knob_summary(a.get("config", {})))
    return table
