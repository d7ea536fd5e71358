"""autotune/apply/display.py: the leaderboard (rows, table) and the live view's per-trial lines,
read from a real journal study written the way a search writes it."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console

from autotune.apply.display import (
    CONFIRMATION_COLUMNS,
    LEADERBOARD_COLUMNS,
    LiveSearch,
    confirmation_summary,
    confirmation_table,
    knob_summary,
    leaderboard_rows,
    leaderboard_table,
)
from autotune.core.config import BASELINE, TrialConfig
from autotune.core.result import TrialResult
from autotune.search.budget import Budget
from autotune.search.store.records import TrialRecord, of_result, write
from autotune.search.store.records import CONFIRMATION
from autotune.search.store.records import FEASIBLE_KEY
from autotune.search.store.storage import open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)

FAST = BASELINE.replace(num_workers=2, precision="bf16")
WARM = BASELINE.replace(num_workers=2, pin_memory=True, optimizer_fusion="fused")
BIG = BASELINE.replace(batch_size=64)


def ok(
    study: optuna.Study,
    role: str,
    knobs: dict[str, Any],
    sps: float,
    speedup: float | None,
    peak: int | None,
    wait: float | None,
    contended: bool = False,
) -> FrozenTrial:
    """As runner.run_one records a trial that finished: feasible constraint, record, value."""
    trial = study.ask()
    trial.set_user_attr("role", role)
    trial.set_constraint(FEASIBLE_KEY, 0.0)
    result = TrialResult(
        status="ok",
        samples_per_s=sps,
        peak_memory_bytes=peak,
        data_wait_fraction=wait,
        step_time_p50=0.1,
        step_time_p90=0.12,
        timed_steps=20,
    )
    write(trial, of_result(role, TrialConfig().replace(**knobs), result, speedup, contended))
    return study.tell(trial, sps)


def failed(
    study: optuna.Study, knobs: dict[str, Any], reason: str, message: str, state: TrialState | None
) -> FrozenTrial:
    """As run_one records a failure: state None is an infeasible config (complete, constraint 1, value 0)."""
    trial = study.ask()
    write(trial, TrialRecord(role="search", config=knobs))
    write(trial, TrialRecord(role="search", reason=reason, message=message, log_tail="..."))
    if state is None:
        trial.set_constraint(FEASIBLE_KEY, 1.0)
        return study.tell(trial, 0.0)
    return study.tell(trial, state=state)


@pytest.fixture
def search(tmp_path: Path) -> tuple[optuna.Study, dict[str, FrozenTrial]]:
    study = optuna.create_study(
        study_name="disp", storage=open_storage(str(tmp_path / "studies.db")), direction="maximize"
    )
    t = {
        "baseline": ok(study, "baseline", BASELINE.knobs(), 10.0, 1.0, 300 * 2**20, 0.25),
        "fast": ok(study, "search", FAST.knobs(), 20.0, 2.0, 200 * 2**20, 0.05),
        "oom": failed(study, BIG.knobs(), "oom", "CUDA out of memory. Tried to allocate 20.00 GiB", None),
        "crash": failed(
            study, BASELINE.replace(compile="default").knobs(), "crash", "worker died with signal 9", TrialState.FAIL
        ),
        "pruned": failed(
            study, BASELINE.replace(num_threads=1).knobs(), "pruned", "could not beat the best", TrialState.PRUNED
        ),
        "warm": ok(study, "warm_start", WARM.knobs(), 15.0, None, None, 0.0),
    }
    return study, t


def console() -> Console:
    return Console(record=True, width=200, file=io.StringIO(), color_system=None)


# --- knob_summary -------------------------------------------------------------------------------------


def test_knob_summary_shows_only_what_differs_from_the_baseline() -> None:
    assert knob_summary(BASELINE.knobs()) == "(baseline)"
    assert set(knob_summary(FAST.knobs()).split()) == {"num_workers=2", "precision=bf16"}
    assert knob_summary(BASELINE.replace(set_to_none=False).knobs()) == "set_to_none=False"  # a default of True


def test_knob_summary_ignores_what_is_not_a_knob() -> None:
    assert knob_summary({**BASELINE.knobs(), "image_size": 64, "data_dir": "/d", "lr": 0.1}) == "(baseline)"
    assert knob_summary({"batch_size": 16, "seed": 3}) == "batch_size=16"
    assert knob_summary({}) == "(baseline)"


# --- leaderboard_rows -----------------------------------------------------------------------------------


def test_rows_are_the_feasible_trials_fastest_first(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    rows = leaderboard_rows(study, 10)
    assert all(len(r) == len(LEADERBOARD_COLUMNS) for r in rows)
    assert [r[1] for r in rows] == [str(t[k].number) for k in ("fast", "warm", "baseline")]  # no oom/crash/pruned
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert [r[3] for r in rows] == ["20.00", "15.00", "10.00"]


def test_row_cells(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, _ = search
    fast, warm, base = leaderboard_rows(study, 10)
    cells = dict(zip(LEADERBOARD_COLUMNS, fast))
    assert (cells["role"], cells["speedup"], cells["peak MiB"], cells["data wait"]) == ("search", "x2.00", "200", "5%")
    assert set(cells["config"].split()) == {"num_workers=2", "precision=bf16"}
    cells = dict(zip(LEADERBOARD_COLUMNS, base))
    assert (cells["role"], cells["speedup"], cells["peak MiB"], cells["data wait"], cells["config"]) == (
        "baseline",
        "x1.00",
        "300",
        "25%",
        "(baseline)",
    )
    cells = dict(zip(LEADERBOARD_COLUMNS, warm))
    # no speedup or memory stored: a dash, not a made-up figure; a zero data wait is still a figure
    assert (cells["role"], cells["speedup"], cells["peak MiB"], cells["data wait"]) == ("warm_start", "-", "-", "0%")
    assert set(cells["config"].split()) == {"num_workers=2", "pin_memory=True", "optimizer_fusion=fused"}


def test_speedup_is_the_stored_one(tmp_path: Path) -> None:
    """The row shows the speedup the study recorded with the trial, not one recomputed from values."""
    study = optuna.create_study(study_name="s", storage=open_storage(str(tmp_path / "j.db")), direction="maximize")
    ok(study, "baseline", BASELINE.knobs(), 10.0, 1.0, None, None)
    ok(study, "search", FAST.knobs(), 30.0, 2.5, None, None)  # measured against an earlier baseline figure
    assert [r[4] for r in leaderboard_rows(study, 10)] == ["x2.50", "x1.00"]


def test_top_limits_the_rows(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    assert [r[1] for r in leaderboard_rows(study, 1)] == [str(t["fast"].number)]
    assert leaderboard_rows(study, 0) == []


def test_a_study_without_a_finished_trial_has_no_rows(tmp_path: Path) -> None:
    study = optuna.create_study(study_name="e", storage=open_storage(str(tmp_path / "j.db")), direction="maximize")
    failed(study, BIG.knobs(), "oom", "out of memory", None)
    assert leaderboard_rows(study, 10) == []


# --- leaderboard_table ----------------------------------------------------------------------------------


def test_table_renders_the_rows(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    c = console()
    c.print(leaderboard_table(study, top=10))
    text = c.export_text()
    assert "study disp: 6 trials" in text and "top 10" not in text
    c = console()
    c.print(leaderboard_table(study, top=2))
    assert "study disp: top 2 of 6 trials" in c.export_text()
    for col in ("samples/s", "speedup", "peak MiB", "data wait", "config"):
        assert col in text
    lines = text.splitlines()
    fast = next(i for i, line in enumerate(lines) if "x2.00" in line)
    base = next(i for i, line in enumerate(lines) if "x1.00" in line)
    assert fast < base
    assert "20.00" in lines[fast] and "precision=bf16" in lines[fast] and "search" in lines[fast]
    assert "10.00" in lines[base] and "(baseline)" in lines[base] and "baseline" in lines[base]
    assert "batch_size=64" not in text and "compile=default" not in text and "num_threads=1" not in text
    assert sum(("search" in line or "baseline" in line or "warm_start" in line) for line in lines) == 3


# --- LiveSearch -----------------------------------------------------------------------------------------


def finished_line(study: optuna.Study, trial: FrozenTrial) -> str:
    c = console()
    LiveSearch(study, None, c).finished(trial)
    lines = c.export_text().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_live_line_for_a_fast_contended_trial(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    starved = ok(study, "search", FAST.knobs(), 20.0, 2.0, 200 * 2**20, 0.05, contended=True)
    line = finished_line(study, starved)
    assert f"trial {starved.number:3d}" in line and "20.00 samples/s" in line and "x2.00" in line
    assert "contended" in line and "timing suspect" in line
    assert "precision=bf16" in line


def test_a_contended_figure_ranks_below_every_clean_one(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    starved = ok(study, "search", BIG.knobs(), 99.0, 9.9, None, None, contended=True)  # fastest, but starved
    numbers = [row[1] for row in leaderboard_rows(study, 10)]
    assert numbers[-1] == str(starved.number) and numbers[0] == str(t["fast"].number)


def test_live_line_for_a_clean_trial_has_no_contended_note(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    line = finished_line(study, t["baseline"])
    assert "10.00 samples/s" in line and "x1.00" in line and "baseline" in line and "(baseline)" in line
    assert "contended" not in line


def test_live_line_for_a_pruned_trial_gives_its_reason(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    line = finished_line(study, t["pruned"])
    assert "pruned: could not beat the best" in line
    assert "samples/s" not in line and "num_threads=1" in line


def test_live_line_for_a_failed_trial_gives_its_reason(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    line = finished_line(study, t["crash"])
    assert "fail" in line and "crash: worker died with signal 9" in line
    assert "samples/s" not in line


def test_live_line_for_an_infeasible_trial(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    line = finished_line(study, t["oom"])  # complete in Optuna, but not a figure anyone may use
    assert "infeasible" in line and "oom: CUDA out of memory" in line
    assert "0.00 samples/s" not in line and "batch_size=64" in line


def test_live_line_cuts_a_long_message(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, _ = search
    t = failed(study, BASELINE.knobs(), "crash", "E" * 300 + "TAIL", TrialState.FAIL)
    line = finished_line(study, t)
    assert "E" * 80 in line and "E" * 81 not in line and "TAIL" not in line


def test_live_panel_counts_and_best(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    study, t = search
    c = console()
    live = LiveSearch(
        study,
        Budget(
            started=time.monotonic(),
            budget_s=125.0,
            trial_timeout_s=60.0,
            grace_s=30.0,
            confirm_reserve_s=0.0,
            parity_reserve_s=0.0,
        ),
        c,
    )
    live.started(7, "search", FAST)
    live.window(12.5)
    c.print(live._render())
    text = c.export_text()
    assert "trial 7 (search) running" in text and "precision=bf16" in text
    assert "12.50 samples/s" in text
    assert f"20.00 samples/s (trial {t['fast'].number}), x2.00 vs baseline" in text
    assert "3 done, 2 failed, 1 pruned" in text  # the infeasible trial counts as failed
    assert "2m0" in text and "no limit" not in text  # about 125 s left


# --- the leaderboard at the width it is printed at ------------------------------------------------------

# Every speed knob at once and a changed precision: a config cell and a training-math cell that cannot
# share 80 columns (or 200) with the figures.
LONG = BASELINE.replace(
    num_workers=2,
    pin_memory=True,
    persistent_workers=True,
    prefetch_factor=4,
    optimizer_fusion="fused",
    channels_last=True,
    cudnn_benchmark=True,
    precision="bf16",
)
LONG_KNOBS = (
    "num_workers=2",
    "pin_memory=True",
    "persistent_workers=True",
    "prefetch_factor=4",
    "optimizer_fusion=fused",
    "channels_last=True",
    "cudnn_benchmark=True",
    "precision=bf16",
)
CONFIRMED = {
    "rounds": 3,
    "winner": 6,
    "order_changed": False,
    "search_order": ["trial 6"],
    "confirmed_order": ["trial 6"],
    "baseline_median": 10.0,
    "rows": [
        {
            "label": "trial 6",
            "trial": 6,
            "search_samples_per_s": 31.0,
            "samples_per_s_median": 30.5,
            "min": 29.75,
            "max": 31.25,
            "ratios": [2.98, 3.12, 3.05],
            "speedup_median": 3.05,
            "speedup_range": [2.98, 3.12],
        },
        {
            "label": "baseline",
            "trial": 0,
            "search_samples_per_s": 10.0,
            "samples_per_s_median": 10.0,
            "min": 9.5,
            "max": 10.5,
            "speedup_median": 1.0,
            "speedup_range": [0.95, 1.05],
        },
    ],
}


def printed_to_a_file(study: optuna.Study, width: int, path: Path) -> tuple[list[str], list[str]]:
    """The end of a search as a log file `width` columns wide gets it: (leaderboard lines, confirmation lines)."""
    with path.open("w") as f:
        c = Console(file=f, width=width, color_system=None)
        c.print(leaderboard_table(study))
        confirmed = confirmation_table(study)
        if confirmed is not None:
            c.print(confirmed)
    lines = path.read_text().splitlines()
    cut = next((i for i, line in enumerate(lines) if "confirmed:" in line), len(lines))
    assert all(len(line) <= width for line in lines), lines
    return lines[:cut], lines[cut:]


@pytest.mark.parametrize("width", [80, 200])
def test_a_log_file_shows_one_readable_row_per_trial(
    search: tuple[optuna.Study, dict[str, FrozenTrial]], tmp_path: Path, width: int
) -> None:
    study, t = search
    long = ok(study, "search", LONG.knobs(), 31.0, 3.1, 250 * 2**20, 0.0)
    assert long.number == 6
    study.set_user_attr(CONFIRMATION, CONFIRMED)
    board, confirmed = printed_to_a_file(study, width, tmp_path / "search.log")
    for trial, role, cells in (
        (long, "search", ("31.00", "x3.10", "250", "0%")),
        (t["fast"], "search", ("20.00", "x2.00", "200", "5%")),
        (t["warm"], "warm_start", ("15.00", "-", "0%")),
        (t["baseline"], "baseline", ("10.00", "x1.00", "300", "25%")),
    ):
        row = [line for line in board if f" {trial.number} " in line and f" {cells[0]} " in line]
        assert len(row) == 1, (trial.number, board)  # its figures together, on one line
        assert role in row[0] and all(cell in row[0] for cell in cells), row
    # The long cells are whole: not cut into a column of a few letters per line.
    text = "\n".join(board)
    assert all(knob in text for knob in LONG_KNOBS), board
    assert text.count("precision fp32 -> bf16") == 2  # the long trial's and the fast one's training math
    # The confirmation: each config's figures and its speedup range on one line.
    assert confirmed and "3 interleaved round(s)" in confirmed[0]
    for label, cells in (
        ("trial 6", ("31.00", "30.50", "29.75", "31.25", "x3.05", "x2.98 .. x3.12 75%")),
        ("baseline", ("10.00", "9.50", "10.50", "x1.00", "x0.95 .. x1.05")),
    ):
        row = [line for line in confirmed if label in line and cells[-1] in line]
        assert len(row) == 1 and all(cell in row[0] for cell in cells), (label, confirmed)


def test_long_cells_go_under_their_row_only_where_the_table_does_not_fit(
    search: tuple[optuna.Study, dict[str, FrozenTrial]], tmp_path: Path
) -> None:
    study, t = search
    board, _ = printed_to_a_file(study, 200, tmp_path / "wide.log")  # short configs: one table row each
    row = next(line for line in board if " 20.00 " in line)
    assert "precision fp32 -> bf16" in row and "num_workers=2" in row and "│" in row
    assert not any(line.strip().startswith(("config:", "training math:")) for line in board)
    long = ok(study, "search", LONG.knobs(), 31.0, 3.1, 250 * 2**20, 0.0)
    board, _ = printed_to_a_file(study, 80, tmp_path / "narrow.log")
    first = next(i for i, line in enumerate(board) if " 31.00 " in line)
    assert f" {long.number} " in board[first] and "num_workers" not in board[first]
    assert board[first + 1].strip() == "training math: precision fp32 -> bf16"
    assert board[first + 2].strip().startswith("config: num_workers=2 pin_memory=True")


def test_the_report_shows_the_terminals_confirmation_rows(search: tuple[optuna.Study, dict[str, FrozenTrial]]) -> None:
    from autotune.apply.report import confirmation_html

    study, _ = search
    assert confirmation_summary(study) is None and confirmation_table(study) is None
    assert "not confirmed" in confirmation_html(study)
    study.set_user_attr(CONFIRMATION, CONFIRMED)
    confirmed = confirmation_summary(study)
    assert confirmed is not None
    heading, rows = confirmed
    assert "3 interleaved round(s)" in heading and "trial 6" in heading
    assert rows == [
        ("trial 6", "31.00", "30.50", "29.75", "31.25", "x3.05", "x2.98 .. x3.12 75%"),
        ("baseline", "10.00", "10.00", "9.50", "10.50", "x1.00", "x0.95 .. x1.05"),
    ]
    html = confirmation_html(study)
    assert re.findall(r"<th>([^<]*)</th>", html) == list(CONFIRMATION_COLUMNS)
    assert re.findall(r"<td[^>]*>([^<]*)</td>", html) == [cell for row in rows for cell in row]


def test_a_confirmed_winner_is_called_faster_only_by_its_sign_test_interval() -> None:
    from autotune.apply.display import _fastest

    assert _fastest(CONFIRMED) == (  # type: ignore[arg-type]
        "measurably faster: trial 6, faster than the baseline: x3.05 (x2.98..x3.12, 75% sign-test interval, 3 rounds)"
    )
    slower = {**CONFIRMED, "rows": [{**CONFIRMED["rows"][0], "speedup_median": 0.85}, CONFIRMED["rows"][1]]}
    slower["rows"][0]["ratios"] = [0.80, 0.85, 0.90]
    assert _fastest(slower).startswith("none measurably faster than the baseline (best by median: trial 6, slower")  # type: ignore[arg-type]
    two = {**CONFIRMED, "rows": [{**CONFIRMED["rows"][0], "ratios": [1.30, 1.23], "speedup_median": 1.265}]}
    assert "no measurable gain yet" in _fastest(two)  # type: ignore[arg-type]


def test_the_final_lines_name_the_faster_config_the_export_passed_over(tmp_path: Path) -> None:
    """Two rounds faster in both are no measured gain: the final lines say the baseline is kept, and name
    the faster config and why, as best.yaml's passed_over does."""
    from autotune.apply.display import export_notes
    from autotune.apply.report import confirmation_html
    from tests.search.store.test_results import _confirmed, study_with

    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 2}, 13.0)], math={0: (), 1: ()})
    _confirmed(study, {1: [1.30, 1.23]})
    lines = export_notes(study)
    assert lines[0] == "no change exported: the export is the baseline's own config"
    assert lines[1].startswith("trial 1 (x1.27) was faster but is not exported: no measurable gain yet")
    assert "at least 3 paired rounds decide" in confirmation_html(study)
    _confirmed(study, {1: [1.30, 1.23, 1.25]})
    assert export_notes(study) == [
        "the exported trial 1: faster than the baseline: x1.25 (x1.23..x1.30, 75% sign-test interval, 3 rounds)"
    ]


# --- the unit: samples/s, or steps/s where a script's trials count no samples ---------------------------------


def test_a_study_measured_in_steps_says_steps_per_second_wherever_a_figure_is_shown(tmp_path: Path) -> None:
    """A script with no loader and no at.batch_size(): its trials count optimizer steps, and the live line,
    the panel, the leaderboard, the report and best.yaml all say steps/s, never samples/s."""
    from autotune.apply.report import _summary, leaderboard_html
    from autotune.core.configfile import Export, to_yaml

    study = optuna.create_study(study_name="steps", storage=open_storage(str(tmp_path / "s.db")), direction="maximize")
    steps = {"unit": "steps/s", "why": "no loader delivered batches: optimizer steps are counted, not samples"}
    made = []
    for role, knobs, sps in (("baseline", BASELINE.knobs(), 3.0), ("search", FAST.knobs(), 4.0)):
        trial = study.ask()
        trial.set_constraint(FEASIBLE_KEY, 0.0)
        result = TrialResult(
            status="ok", samples_per_s=sps, step_time_p50=0.3, timed_steps=4, applied={"throughput": steps}
        )
        write(trial, of_result(role, TrialConfig().replace(**knobs), result, None, False))
        made.append(study.tell(trial, sps))
    assert "4.00 steps/s" in finished_line(study, made[1])
    c = console()
    live = LiveSearch(study, None, c)
    live.current_sps = 4.0
    c.print(live._render())
    panel = c.export_text()
    assert "steps/s" in panel and "samples/s" not in panel
    table = console()
    table.print(leaderboard_table(study))
    assert "steps/s" in table.export_text() and "samples/s" not in table.export_text()
    assert "steps/s" in leaderboard_html(study) and "samples/s" not in leaderboard_html(study)
    said = dict(_summary(study, 3.0))
    assert said["baseline"] == "3.00 steps/s" and said["best"].startswith("4.00 steps/s")
    yaml_text = to_yaml(Export.from_result(TrialConfig(), TrialRecord.from_frozen(made[1]).result()))
    assert "throughput_unit: 'steps/s: no loader delivered batches" in yaml_text
