"""`autotune report`: one self-contained HTML file (plotly, JS inlined) plus a PNG (matplotlib) per figure
(the figures are apply/figures.py's)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from autotune.apply.figures import (
    escaped,
    figure_png,
    history_figure,
    importance_figure,
    pareto_figure,
    waterfall_figure,
    waterfall_png,
)
from autotune.apply.display import (
    CONFIRMATION_COLUMNS,
    COST_COLUMNS,
    LEADERBOARD_COLUMNS,
    LONG_COLUMNS,
    batch_cell,
    ceiling_note,
    confirmation_summary,
    cost_rows,
    export_notes,
    in_unit,
    leaderboard_rows,
    order_note,
)
from autotune.core.files import write_atomic
from autotune.core.outcomes import Outcome
from autotune.search.loop.alone import said
from autotune.search.space.memory import versus_peak
from autotune.search.store import last_word, records
from autotune.search.store.records import StudyRecord, TrialRecord, throughput_unit
from autotune.search.store.results import baseline_sps, leaderboard


# ---- tables and the page ---------------------------------------------------------------------


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], long: Sequence[str] = ()) -> str:
    """Figures stay on one line (a range such as x1.20 .. x1.35 broken in two reads as two values); only
    the `long` columns (free text) wrap, and a window too narrow for the rest scrolls the table sideways."""
    th = "".join(f"<th>{escaped(h)}</th>" for h in head)
    cls = ["" if h in long else " class=fig" for h in head]
    body = "".join("<tr>" + "".join(f"<td{k}>{escaped(c)}</td>" for k, c in zip(cls, r)) + "</tr>" for r in rows)
    return f"<div class=scroll><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>"


def leaderboard_html(study: Any, top: int = 20) -> str:
    rows = leaderboard_rows(study, top)
    if not rows:
        return "<p class=note>No feasible trial finished yet.</p>"
    return _table(in_unit(LEADERBOARD_COLUMNS, throughput_unit(study)), rows, long=LONG_COLUMNS)


def confirmation_html(study: Any) -> str:
    """The confirmation rounds the exported winner came out of, or a note that there were none."""
    confirmed = confirmation_summary(study)  # the terminal's rows: the two never disagree
    head = '<section id="confirmation"><h2>Confirmation</h2>'
    notes = "".join(f"<p>{escaped(line)}</p>" for line in export_notes(study))  # the final lines' verdict
    if confirmed is None:
        return head + "<p class=note>not confirmed: the figures are single measurements</p>" + notes + "</section>"
    heading, rows = confirmed
    note = order_note(study)
    return (
        head
        + f"<p>{escaped(heading)}</p>"
        + (f"<p>{escaped(note)}</p>" if note else "")
        + _table(in_unit(CONFIRMATION_COLUMNS, throughput_unit(study)), rows)
        + notes
        + "</section>"
    )


# The memory estimate made before launch (search/space/memory.py) beside the peak each trial measured.
MEMORY_COLUMNS = (
    "trial",
    "role",
    "batch",
    "strategy",
    "estimate MiB",
    "peak MiB",
    "error",
    "params / grads / optimizer / activations / runtime MiB",
)


def memory_rows(study: Any, top: int | None = None) -> list[tuple[str, ...]]:
    """One row of text cells per trial with an estimate, in trial order (`top`: the last ones only);
    a config written off before launch shows "skipped" for its peak. The terminal (`show`) and the
    HTML report print these."""

    def mib(x: Any) -> str:
        return f"{x / 2**20:.0f}" if x is not None else "-"

    rows: list[tuple[str, ...]] = []
    for t in study.get_trials(deepcopy=False):
        r = TrialRecord.from_frozen(t)
        est = r.memory_estimate
        if not est or records.outcome(t) == Outcome.REUSED:  # its first trial's row says it
            continue
        peak = r.metrics.get("peak_memory_bytes")
        mine = versus_peak(est, peak)
        parts = " / ".join(mib(est.get(k)) for k in ("params", "grads", "optimizer", "activations", "runtime"))
        rows.append(
            (
                str(t.number),
                r.role,
                batch_cell(r),
                str(est.get("strategy", "")),
                mib(est.get("total")),
                "skipped" if records.outcome(t) == Outcome.WRITTEN_OFF else mib(peak),
                f"{mine['error']:+.0%}" if mine else "-",
                parts,
            )
        )
    return rows[-top:] if top else rows


def memory_html(study: Any) -> str:
    return _estimate_section(
        "memory",
        "Memory estimate vs measured peak",
        memory_rows(study),
        MEMORY_COLUMNS,
        "Estimated per rank before launch from the parameter count and one measured activation figure; "
        "error = (estimate - peak) / peak.",
        "no trial recorded a memory estimate",
        long=("strategy",),
    )


def cost_html(study: Any) -> str:
    return _estimate_section(
        "cost",
        "Time estimate vs wall time taken",
        cost_rows(study),
        COST_COLUMNS,
        "Estimated before launch from the nearest measured config (start-up, warm-up and timed steps at its "
        "step time, scaled with the samples a step computes); error = (estimate - taken) / taken.",
        "no trial recorded a time estimate",
    )


def _estimate_section(
    anchor: str, title: str, rows: list[Any], columns: Any, how: str, empty: str, long: tuple[str, ...] = ()
) -> str:
    """A section of estimates made before launch beside what was measured, with how they were made."""
    head = f'<section id="{anchor}"><h2>{title}</h2>'
    if not rows:
        return head + f"<p class=note>{empty}</p></section>"
    return head + f"<p>{how}</p>" + _table(columns, rows, long=long) + "</section>"


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f0f0f0}.note{color:#666;font-style:italic}section{margin:2em 0}
.scroll{overflow-x:auto}td.fig{white-space:nowrap}"""


def write_report(study: Any, out: Path) -> list[Path]:
    """Write the HTML report and its PNGs; returns every file written, the HTML first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    base, record = baseline_sps(study), StudyRecord.of(study)
    written, parts = _figure_sections(study, base, record.ablation, out)
    fp = record.fingerprint
    page = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>autotune report: {escaped(study.study_name)}</title><style>{CSS}</style></head><body>",
        f"<h1>autotune report: study {escaped(study.study_name)}</h1>",
        f"<p class=note>generated {escaped(_dt.datetime.now().isoformat(timespec='seconds'))}</p>",
        _table(("", ""), _summary(study, base), long=("",)),
        '<section id="leaderboard"><h2>Leaderboard</h2>',
        leaderboard_html(study),
        "</section>",
        confirmation_html(study),
        memory_html(study),
        cost_html(study),
        *parts,
        '<section id="fingerprint"><h2>Fingerprint</h2>',
        _table(("key", "value"), list(fp.items()), long=("value",)) if fp else "<p class=note>none recorded</p>",
        "</section></body></html>",
    ]
    write_atomic(out, "\n".join(page))
    return [out, *written]


def _figure_sections(study: Any, base: float | None, ablation: Any, out: Path) -> tuple[list[Path], list[str]]:
    """(the PNGs written beside `out`, one HTML section per figure): a figure with nothing to show yet is a
    note saying why."""
    figures: list[tuple[str, str, Any, str]] = [  # (id, heading, figure or None, note)
        (
            "history",
            "Optimization history",
            history_figure(study, base) if study.trials else None,
            "" if study.trials else "no trials yet",
        ),
        ("importance", "Parameter importances", *importance_figure(study)),
        ("pareto", "Pareto front", *pareto_figure(study)),
        (
            "ablation",
            "Ablation waterfall",
            waterfall_figure(ablation) if ablation else None,
            "" if ablation else f"no ablation run yet: autotune ablate --study {study.study_name}",
        ),
    ]
    written, parts, first = [], [], True
    for fid, heading, fig, note in figures:
        if fig is None:
            parts.append(f'<section id="{fid}"><h2>{escaped(heading)}</h2><p class=note>{escaped(note)}</p></section>')
            continue
        png = out.with_name(f"{out.stem}-{fid}.png")
        written.append(waterfall_png(ablation or [], png) if fid == "ablation" else figure_png(fig, png))
        config = {"displaylogo": False, "responsive": True}
        div = fig.to_html(full_html=False, include_plotlyjs=first, div_id=f"fig-{fid}", config=config)
        first = False  # plotly.js is inlined once, with the first figure: no CDN, works offline
        parts.append(
            f'<section id="{fid}"><h2>{escaped(heading)}</h2>{div}<p><a href="{escaped(png.name)}">PNG</a></p></section>'
        )
    return written, parts


def _summary(study: Any, base: float | None) -> list[tuple[str, Any]]:
    board, unit = leaderboard(study), throughput_unit(study)
    summary: list[tuple[str, Any]] = [
        ("trials", len(study.trials)),
        ("feasible", len(board)),
        ("baseline", f"{base:.2f} {unit}" if base else "-"),
    ]
    if board:
        best, speedup = board[0], TrialRecord.from_frozen(board[0]).speedup
        summary.append(
            (
                "best",
                f"{best.value:.2f} {unit} (trial {best.number})" + (f", x{speedup:.2f} vs baseline" if speedup else ""),
            )
        )
    alone = last_word.read(study)
    if alone:  # a script study's figure: the script as written against the export applied, each alone
        summary.append(("your script alone", said(alone)))
    ceiling = ceiling_note(study)
    if ceiling:
        summary.append(("ceiling", ceiling))
    return summary
