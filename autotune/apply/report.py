"""`autotune report`: one self-contained HTML file (plotly, JS inlined) plus a PNG (matplotlib) per figure.

Also home of the ablation waterfall, drawn both ways: `autotune ablate` writes its PNG from here.
"""
from __future__ import annotations

import datetime as _dt
import html
import math
import warnings
from pathlib import Path
from typing import Any
from collections.abc import Sequence

GREEN, RED, GREY, BLUE = "#2ca02c", "#d62728", "#7f7f7f", "#1f77b4"


def _e(x: Any) -> str:
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
        ax.annotate(f"{delta}\nx{speedup:.2f}", (i, max(lo, hi)), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
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
    fig = go.Figure(go.Waterfall(x=[_e(r[0]) for r in rows], y=y, measure=measure, text=[_e(t) for t in text],
                                 textposition="outside", increasing={"marker": {"color": GREEN}},
                                 decreasing={"marker": {"color": RED}}, totals={"marker": {"color": BLUE}}))
    fig.update_layout(title="Ablation: each technique's contribution and the cumulative speedup",
                      yaxis_title="samples/s", showlegend=False)
    return fig


# ---- the study's figures ---------------------------------------------------------------------

def history_figure(study: Any, base: float | None) -> Any:
    import optuna

    fig = optuna.visualization.plot_optimization_history(study)
    if base:
        fig.add_hline(y=base, line_dash="dash", line_color=GREY, annotation_text=f"baseline {base:.2f} samples/s")
    fig.update_layout(title="Optimization history", yaxis_title="samples/s")
    return fig


def importance_figure(study: Any) -> tuple[Any | None, str]:
    """Optuna's default evaluator; (None, why) when the study cannot support an importance estimate."""
    import optuna
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.params]
    if len(done) < 3:
        return None, f"parameter importances need at least 3 complete trials with searched parameters; this study has {len(done)}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig = optuna.visualization.plot_param_importances(study)
    except (ValueError, RuntimeError) as e:
        return None, f"parameter importances could not be computed: {e}"
    if not fig.data:
        return None, "parameter importances could not be computed (no parameter varies across the trials)"
    fig.update_layout(title="Parameter importances (Optuna's default evaluator, objective samples/s)")
    return fig, ""


def pareto_points(study: Any) -> list[tuple[int, float, float, bool, str]]:
    """(trial, peak MiB, samples/s, on the front, config) for feasible trials that recorded memory."""
    from autotune.apply.display import knob_summary
    from autotune.search.records import TrialRecord
    from autotune.search.results import leaderboard

    records = [(t, TrialRecord.from_frozen(t)) for t in leaderboard(study)]
    pts = [(t.number, r.metrics["peak_memory_bytes"] / 2**20, float(t.value or 0), knob_summary(r.config))
           for t, r in records if r.metrics.get("peak_memory_bytes")]
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
        fig.add_trace(go.Scatter(x=[p[1] for p in sel], y=[p[2] for p in sel], name=name,
                                 mode="lines+markers" if on else "markers", marker={"color": color, "size": 9},
                                 line={"shape": "hv"} if on else None,
                                 text=[_e(f"trial {p[0]}: {p[4]}") for p in sel], hoverinfo="text+x+y"))
    fig.update_layout(title="Pareto front: samples/s vs peak memory", xaxis_title="peak memory (MiB)",
                      yaxis_title="samples/s")
    return fig, ""


def figure_png(fig: Any, path: Path) -> Path:
    """A matplotlib copy of a scatter/bar plotly figure (its traces, hlines and titles)."""
    from matplotlib.figure import Figure

    out = Figure(figsize=(8, 4.8), layout="constrained")
    ax = out.add_subplot()
    for tr in fig.data:
        color = tr.marker.color if isinstance(getattr(tr.marker, "color", None), str) else None
        if tr.type == "bar":
            (ax.barh if tr.orientation == "h" else ax.bar)(list(tr.y if tr.orientation == "h" else tr.x),
                                                          list(tr.x if tr.orientation == "h" else tr.y), color=color or BLUE)
            continue
        mode = tr.mode or "markers"
        if "lines" in mode:
            ax.plot(list(tr.x), list(tr.y), color=color, label=tr.name,
                    drawstyle="steps-post" if tr.line and tr.line.shape == "hv" else "default",
                    marker="o" if "markers" in mode else None)
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


# ---- tables and the page ---------------------------------------------------------------------

def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], long: Sequence[str] = ()) -> str:
    """Figures stay on one line (a range such as x1.20 .. x1.35 broken in two reads as two values); only
    the `long` columns (free text) wrap, and a window too narrow for the rest scrolls the table sideways."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    cls = ["" if h in long else " class=fig" for h in head]
    body = "".join("<tr>" + "".join(f"<td{k}>{_e(c)}</td>" for k, c in zip(cls, r)) + "</tr>" for r in rows)
    return f"<div class=scroll><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>"


def leaderboard_html(study: Any, top: int = 20) -> str:
    from autotune.apply.display import LEADERBOARD_COLUMNS, LONG_COLUMNS, leaderboard_rows

    rows = leaderboard_rows(study, top)
    if not rows:
        return "<p class=note>No feasible trial finished yet.</p>"
    return _table(LEADERBOARD_COLUMNS, rows, long=LONG_COLUMNS)


def confirmation_html(study: Any) -> str:
    """The confirmation rounds the exported winner came out of, or a note that there were none."""
    from autotune.apply.display import CONFIRMATION_COLUMNS, confirmation_summary, order_note

    confirmed = confirmation_summary(study)  # the terminal's rows: the two never disagree
    head = '<section id="confirmation"><h2>Confirmation</h2>'
    if confirmed is None:
        return head + "<p class=note>not confirmed: the figures are single measurements</p></section>"
    heading, rows = confirmed
    note = order_note(study)
    return (head + f"<p>{_e(heading)}</p>" + (f"<p>{_e(note)}</p>" if note else "")
            + _table(CONFIRMATION_COLUMNS, rows) + "</section>")


# The memory estimate made before launch (search/memory.py) beside the peak each trial measured.
MEMORY_COLUMNS = ("trial", "role", "batch", "strategy", "estimate MiB", "peak MiB", "error",
                  "params / grads / optimizer / activations / runtime MiB")


def memory_rows(study: Any, top: int | None = None) -> list[tuple[str, ...]]:
    """One row of text cells per trial with an estimate, in trial order (`top`: the last ones only);
    a config written off before launch shows "skipped" for its peak. The terminal (`show`) and the
    HTML report print these."""
    from autotune.search.memory import versus_peak
    from autotune.search.records import TrialRecord

    def mib(x: Any) -> str:
        return f"{x / 2**20:.0f}" if x is not None else "-"

    rows: list[tuple[str, ...]] = []
    for t in study.get_trials(deepcopy=False):
        r = TrialRecord.from_frozen(t)
        est = r.memory_estimate
        if not est or r.repeat_of is not None:  # a reused figure: its first trial's row says it
            continue
        peak = r.metrics.get("peak_memory_bytes")
        mine = versus_peak(est, peak)
        parts = " / ".join(mib(est.get(k)) for k in ("params", "grads", "optimizer", "activations", "runtime"))
        rows.append((str(t.number), r.role, str(r.config.get("batch_size", "-")), str(est.get("strategy", "")),
                     mib(est.get("total")), "skipped" if r.reason == "memory_estimate" else mib(peak),
                     f"{mine['error']:+.0%}" if mine else "-", parts))
    return rows[-top:] if top else rows


def memory_html(study: Any) -> str:
    rows = memory_rows(study)
    head = '<section id="memory"><h2>Memory estimate vs measured peak</h2>'
    if not rows:
        return head + "<p class=note>no trial recorded a memory estimate</p></section>"
    return (head + "<p>Estimated per rank before launch from the parameter count and one measured activation "
            "figure; error = (estimate - peak) / peak.</p>" + _table(MEMORY_COLUMNS, rows, long=("strategy",))
            + "</section>")


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f0f0f0}.note{color:#666;font-style:italic}section{margin:2em 0}
.scroll{overflow-x:auto}td.fig{white-space:nowrap}"""


def write_report(study: Any, out: Path) -> list[Path]:
    """Write the HTML report and its PNGs; returns every file written, the HTML first."""
    from autotune.core.files import write_atomic
    from autotune.search.records import StudyRecord, TrialRecord
    from autotune.search.results import baseline_sps, leaderboard

    out.parent.mkdir(parents=True, exist_ok=True)
    base, board = baseline_sps(study), leaderboard(study)
    figures: list[tuple[str, str, Any, str]] = []  # (id, heading, figure or None, note)
    figures.append(("history", "Optimization history", history_figure(study, base) if study.trials else None,
                    "" if study.trials else "no trials yet"))
    figures.append(("importance", "Parameter importances", *importance_figure(study)))
    figures.append(("pareto", "Pareto front", *pareto_figure(study)))
    record = StudyRecord.of(study)
    ablation = record.ablation
    figures.append(("ablation", "Ablation waterfall", waterfall_figure(ablation) if ablation else None,
                    "" if ablation else f"no ablation run yet: autotune ablate --study {study.study_name}"))

    written, parts, first = [out], [], True
    for fid, heading, fig, note in figures:
        if fig is None:
            parts.append(f'<section id="{fid}"><h2>{_e(heading)}</h2><p class=note>{_e(note)}</p></section>')
            continue
        png = out.with_name(f"{out.stem}-{fid}.png")
        written.append(waterfall_png(ablation or [], png) if fid == "ablation" else figure_png(fig, png))
        div = fig.to_html(full_html=False, include_plotlyjs=first, div_id=f"fig-{fid}",
                          config={"displaylogo": False, "responsive": True})
        first = False  # plotly.js is inlined once, with the first figure: no CDN, works offline
        parts.append(f'<section id="{fid}"><h2>{_e(heading)}</h2>{div}'
                     f'<p><a href="{_e(png.name)}">PNG</a></p></section>')

    n_feasible = len(board)
    summary = [("trials", len(study.trials)), ("feasible", n_feasible),
               ("baseline", f"{base:.2f} samples/s" if base else "-")]
    if board:
        best = board[0]
        summary.append(("best", f"{best.value:.2f} samples/s (trial {best.number})"
                        + (f", x{speedup:.2f} vs baseline" if (speedup := TrialRecord.from_frozen(best).speedup) else "")))
    fp = record.fingerprint
    page = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>autotune report: {_e(study.study_name)}</title><style>{CSS}</style></head><body>",
        f"<h1>autotune report: study {_e(study.study_name)}</h1>",
        f"<p class=note>generated {_e(_dt.datetime.now().isoformat(timespec='seconds'))}</p>",
        _table(("", ""), summary, long=("",)),
        '<section id="leaderboard"><h2>Leaderboard</h2>', leaderboard_html(study), "</section>",
        confirmation_html(study),
        memory_html(study),
        *parts,
        '<section id="fingerprint"><h2>Fingerprint</h2>',
        _table(("key", "value"), list(fp.items()), long=("value",)) if fp else "<p class=note>none recorded</p>",
        "</section></body></html>",
    ]
    write_atomic(out, "\n".join(page))
    return written
