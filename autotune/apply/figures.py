"""The figures of `autotune report` and `autotune ablate`: each drawn with plotly for the HTML page, and
copied with matplotlib to a PNG (the ablation waterfall drawn both ways)."""

from __future__ import annotations

import html
import math
import warnings
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from autotune.apply.display import knob_summary
from autotune.search.store.records import TrialRecord, throughput_unit
from autotune.search.store.results import baseline_knobs, leaderboard

GREEN, RED, GREY, BLUE = "#2ca02c", "#d62728", "#7f7f7f", "#1f77b4"


def escaped(x: Any) -> str:
    """x as HTML text, quotes included (it lands in attributes too)."""
    return html.escape(str(x), quote=True)


# ---- the ablation waterfall ------------------------------------------------------------------


def _waterfall_rows(steps: Sequence[dict[str, Any]]) -> list[tuple[str, float, float, float]]:
    """(label, bottom, top, cumulative speedup) per bar; the last bar is the total, from zero."""
    base = float(steps[0]["samples_per_s"])
    rows, prev = [("baseline", 0.0, base, 1.0)], base
    for s in steps[1:]:
        sps = float(s["samples_per_s"])
        rows.append((f"+ {s['technique']}", prev, sps, sps / base))
        prev = sps
    rows.append(("all applied", 0.0, prev, prev / base))
    return rows


def waterfall_png(steps: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Figure 6 of the seed: each technique's samples/s added on top of the previous ones."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state, Agg via savefig

    rows = _waterfall_rows(steps)
    base = rows[0][2]
    fig = Figure(figsize=(max(6.0, 1.3 * len(rows) + 2), 4.8), layout="constrained")
    ax = fig.add_subplot()
    for i, (_label, lo, hi, speedup) in enumerate(rows):
        total = i in (0, len(rows) - 1)
        color = (GREY if i == 0 else BLUE) if total else (GREEN if hi >= lo else RED)
        ax.bar(i, hi - lo, bottom=lo, color=color, width=0.6)
        delta = f"{hi:.2f}" if total else f"{hi - lo:+.2f}"
        ax.annotate(
            f"{delta}\nx{speedup:.2f}",
            (i, max(lo, hi)),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
        if 0 < i < len(rows) - 1:  # connector from the previous bar's top
            ax.plot([i - 1.3, i - 0.3], [lo, lo], color=GREY, linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("samples/s")
    ax.set_ylim(0, max(r[2] for r in rows) * 1.18)

    def to_speedup(y: Any) -> Any:
        return y / base

    def to_sps(s: Any) -> Any:
        return s * base

    sec = ax.secondary_yaxis("right", functions=(to_speedup, to_sps))
    sec.set_ylabel("speedup vs baseline")
    ax.set_title(title or "Ablation: each technique's contribution (greedy order)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def waterfall_figure(steps: Sequence[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    rows = _waterfall_rows(steps)
    measure = ["absolute"] + ["relative"] * (len(rows) - 2) + ["total"]
    y = [rows[0][2]] + [hi - lo for _, lo, hi, _ in rows[1:-1]] + [0.0]
    text = [f"{hi:.2f} samples/s, x{sp:.2f}" for _, _, hi, sp in rows]
    fig = go.Figure(
        go.Waterfall(
            x=[escaped(r[0]) for r in rows],
            y=y,
            measure=measure,
            text=[escaped(t) for t in text],
            textposition="outside",
            increasing={"marker": {"color": GREEN}},
            decreasing={"marker": {"color": RED}},
            totals={"marker": {"color": BLUE}},
        )
    )
    fig.update_layout(
        title="Ablation: each technique's contribution and the cumulative speedup",
        yaxis_title="samples/s",
        showlegend=False,
    )
    return fig


# ---- the study's figures ---------------------------------------------------------------------


def history_figure(study: Any, base: float | None) -> Any:
    import optuna

    fig = optuna.visualization.plot_optimization_history(study)
    unit = throughput_unit(study)
    if base:
        fig.add_hline(y=base, line_dash="dash", line_color=GREY, annotation_text=f"baseline {base:.2f} {unit}")
    fig.update_layout(title="Optimization history", yaxis_title=unit)
    return fig


def importance_figure(study: Any) -> tuple[Any | None, str]:
    """Optuna's default evaluator; (None, why) when the study cannot support an importance estimate."""
    import optuna
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.params]
    if len(done) < 3:
        return (
            None,
            f"parameter importances need at least 3 complete trials with searched parameters; this study has {len(done)}",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig = optuna.visualization.plot_param_importances(study)
    except (ValueError, RuntimeError) as e:
        return None, f"parameter importances could not be computed: {e}"
    if not fig.data:
        return None, "parameter importances could not be computed (no parameter varies across the trials)"
    fig.update_layout(title=f"Parameter importances (Optuna's default evaluator, objective {throughput_unit(study)})")
    return fig, ""


def pareto_points(study: Any) -> list[tuple[int, float, float, bool, str]]:
    """(trial, peak MiB, samples/s, on the front, config) for feasible trials that recorded memory."""
    records, base = [(t, TrialRecord.from_frozen(t)) for t in leaderboard(study)], baseline_knobs(study)
    pts = [
        (t.number, r.metrics["peak_memory_bytes"] / 2**20, float(t.value or 0), knob_summary(r.config, base))
        for t, r in records
        if r.metrics.get("peak_memory_bytes")
    ]
    best, front = -math.inf, set()
    for n, _mem, sps, _ in sorted(pts, key=lambda p: (p[1], -p[2])):  # less memory first, faster first
        if sps > best:  # nothing using less (or equal) memory is as fast: non-dominated
            front.add(n)
            best = sps
    return [(n, mem, sps, n in front, cfg) for n, mem, sps, cfg in pts]


def pareto_figure(study: Any) -> tuple[Any | None, str]:
    import plotly.graph_objects as go

    pts = pareto_points(study)
    if not pts:
        return None, "no feasible trial recorded peak memory"
    fig = go.Figure()
    for on, name, color in ((False, "dominated", GREY), (True, "pareto front", RED)):
        sel = sorted((p for p in pts if p[3] == on), key=lambda p: p[1])
        fig.add_trace(
            go.Scatter(
                x=[p[1] for p in sel],
                y=[p[2] for p in sel],
                name=name,
                mode="lines+markers" if on else "markers",
                marker={"color": color, "size": 9},
                line={"shape": "hv"} if on else None,
                text=[escaped(f"trial {p[0]}: {p[4]}") for p in sel],
                hoverinfo="text+x+y",
            )
        )
    unit = throughput_unit(study)
    fig.update_layout(title=f"Pareto front: {unit} vs peak memory", xaxis_title="peak memory (MiB)", yaxis_title=unit)
    return fig, ""


def figure_png(fig: Any, path: Path) -> Path:
    """A matplotlib copy of a scatter/bar plotly figure (its traces, hlines and titles)."""
    from matplotlib.figure import Figure

    out = Figure(figsize=(8, 4.8), layout="constrained")
    ax = out.add_subplot()
    for tr in fig.data:
        color = tr.marker.color if isinstance(getattr(tr.marker, "color", None), str) else None
        if tr.type == "bar":
            (ax.barh if tr.orientation == "h" else ax.bar)(
                list(tr.y if tr.orientation == "h" else tr.x),
                list(tr.x if tr.orientation == "h" else tr.y),
                color=color or BLUE,
            )
            continue
        mode = tr.mode or "markers"
        if "lines" in mode:
            ax.plot(
                list(tr.x),
                list(tr.y),
                color=color,
                label=tr.name,
                drawstyle="steps-post" if tr.line and tr.line.shape == "hv" else "default",
                marker="o" if "markers" in mode else None,
            )
        else:
            ax.scatter(list(tr.x), list(tr.y), color=color, label=tr.name, s=25)
    for shape in fig.layout.shapes or ():
        if shape.type == "line" and shape.y0 == shape.y1:
            ax.axhline(shape.y0, color=GREY, linestyle="--", label="baseline")
    ax.set_title(fig.layout.title.text or "")
    ax.set_xlabel(fig.layout.xaxis.title.text or "")
    ax.set_ylabel(fig.layout.yaxis.title.text or "")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    out.savefig(path, dpi=120)
    return path
