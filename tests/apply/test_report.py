"""autotune report: one self-contained HTML file that Chromium renders offline, plus PNG copies."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from autotune.apply import figures, report
from autotune.cli import build_parser
from autotune.core.config import TrialConfig
from autotune.search.store.storage import open_storage

HOSTILE = "<script>window.__pwned=1</script>"
FIGURES = ("history", "importance", "pareto", "ablation")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ABLATION = [
    {"step": 0, "technique": "baseline", "samples_per_s": 5.0, "gain": 0.0, "speedup": 1.0},
    {"step": 1, "technique": "precision=bf16", "samples_per_s": 11.0, "gain": 6.0, "speedup": 2.2},
    {
        "step": 2,
        "technique": "num_workers=2 (+persistent_workers=True)",
        "samples_per_s": 14.5,
        "gain": 3.5,
        "speedup": 2.9,
    },
    {"step": 3, "technique": "channels_last=True", "samples_per_s": 14.0, "gain": -0.5, "speedup": 2.8},
]


def make_study(storage: str, n: int = 12, ablation: bool = True, name: str = "rep") -> optuna.Study:
    """A search as `autotune search` records it: params, config and memory attrs, one infeasible trial."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=open_storage(storage), direction="maximize")
    study.set_user_attr("fingerprint", {"cpu_model": HOSTILE, "cpu_cores": 2, "torch": "2.14.1"})
    rng = random.Random(0)
    dists = {
        "num_workers": IntDistribution(0, 2),
        "precision": CategoricalDistribution(["fp32", "bf16"]),
        "batch_size": CategoricalDistribution([2, 4, 8, 16]),
    }
    for i in range(n):
        p: dict[str, Any] = {
            "num_workers": i % 3,
            "precision": ["fp32", "bf16"][i % 2],
            "batch_size": [2, 4, 8, 16][i % 4],
        }
        if i == 0:
            p = {"num_workers": 0, "precision": "fp32", "batch_size": 8}
        infeasible = i == 5
        sps = 5 + 3 * p["num_workers"] + 6 * (p["precision"] == "bf16") + rng.random()
        study.add_trial(
            optuna.trial.create_trial(
                value=0.0 if infeasible else sps,
                params=p,
                distributions=dists,
                user_attrs={
                    "role": "baseline" if i == 0 else "search",
                    "config": TrialConfig(**p).knobs(),
                    "peak_memory_bytes": int((300 + 40 * p["batch_size"] + 50 * rng.random()) * 2**20),
                    "data_wait_fraction": 0.1,
                },
                constraints={"infeasible": 1.0 if infeasible else 0.0},
            )
        )
    if ablation:
        study.set_user_attr("ablation", ABLATION)
    return study


def test_pareto_front_is_the_non_dominated_set(tmp_path: Path) -> None:
    study = make_study(str(tmp_path / "s.db"))
    pts = figures.pareto_points(study)
    assert len(pts) == 11  # the infeasible trial is left out
    front = [p for p in pts if p[3]]
    for _, mem, sps, on, _ in pts:  # on the front iff no other point is at least as good on both, better on one
        dominated = any(m <= mem and s >= sps and (m < mem or s > sps) for _, m, s, _, _ in pts)
        assert on == (not dominated)
    assert max(p[2] for p in pts) in [p[2] for p in front] and min(p[1] for p in pts) in [p[1] for p in front]


def test_report_of_a_young_study_skips_importances(tmp_path: Path) -> None:
    study = make_study(str(tmp_path / "s.db"), n=2, ablation=False)
    files = report.write_report(study, tmp_path / "r" / "report.html")
    html = files[0].read_text()
    assert "parameter importances need at least 3 complete trials" in html
    assert "no ablation run yet" in html and "autotune ablate --study rep" in html
    assert {f.name for f in files[1:]} == {"report-history.png", "report-pareto.png"}


def test_cli_writes_default_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = str(tmp_path / "studies.db")
    make_study(storage)
    args = build_parser().parse_args(
        ["report", "--study", "rep", "--storage", storage, "--studies-dir", str(tmp_path / "st")]
    )
    assert args.func(args) == 0
    out = tmp_path / "st" / "rep" / "report.html"
    assert out.is_file() and f"wrote {out}" in capsys.readouterr().out
    for fig in FIGURES:
        assert (out.parent / f"report-{fig}.png").read_bytes()[:4] == b"\x89PNG"


def chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],  # type: ignore[list-item]
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run installs it)"
)
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    study = make_study(str(tmp_path / "s.db"))
    files = report.write_report(study, tmp_path / "out" / "report.html")
    page = files[0]
    text = page.read_text()
    # Self-contained: plotly.js inlined once, every script inline (none loaded from a CDN or a file).
    assert text.count("Plotly.newPlot") == len(FIGURES) and not re.search(r"<script[^>]*\bsrc=", text)
    assert len(re.findall(r"plotly\.js v\d", text)) == 1  # the library's banner: inlined exactly once
    assert len(files) == 1 + len(FIGURES)

    run = chromium(
        ["--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        tmp_path / "profile",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    for fig in FIGURES:  # plotly drew an SVG inside every figure's section
        m = re.search(rf'<section id="{fig}">(.*?)</section>', dom, re.S)
        assert m and 'class="main-svg"' in m.group(1), f"figure {fig} was not drawn"
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == [], console  # the page logs nothing: no errors, no warnings
    assert HOSTILE not in dom and "window.__pwned=1&lt;/script&gt;" in dom  # escaped, never run
    assert "Leaderboard" in dom and "x1.00" in dom and "2.14.1" in dom

    shot = tmp_path / "report.png"
    chromium(
        ["--virtual-time-budget=10000", "--window-size=1200,3400", f"--screenshot={shot}", page.as_uri()],
        tmp_path / "profile2",
    )
    assert shot.is_file() and shot.stat().st_size > 50_000  # a page of drawn figures, not a blank one


def test_memory_rows_put_the_estimate_beside_the_peak_with_its_error(tmp_path: Path) -> None:
    study = optuna.create_study(study_name="mem", storage=open_storage(str(tmp_path / "m.db")), direction="maximize")
    mib = 2**20
    estimate = {
        "params": 10 * mib,
        "grads": 10 * mib,
        "optimizer": 20 * mib,
        "activations": 60 * mib,
        "runtime": 0,
        "total": 100 * mib,
        "strategy": "ddp x2",
    }
    study.add_trial(
        optuna.trial.create_trial(
            value=5.0,
            user_attrs={
                "role": "search",
                "config": {"batch_size": 16},
                "memory_estimate": estimate,
                "peak_memory_bytes": 80 * mib,
            },
        )
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=0.0,
            constraints={"infeasible": 1.0},
            user_attrs={
                "role": "search",
                "config": {"batch_size": 64},
                "memory_estimate": {**estimate, "total": 400 * mib},
                "reason": "memory_estimate",
                "message": "batch 64 under ddp x2: estimated ...; skipped",
            },
        )
    )
    study.add_trial(optuna.trial.create_trial(value=4.0, user_attrs={"role": "search", "peak_memory_bytes": mib}))
    assert report.memory_rows(study) == [
        ("0", "search", "16", "ddp x2", "100", "80", "+25%", "10 / 10 / 20 / 60 / 0"),
        ("1", "search", "64", "ddp x2", "400", "skipped", "-", "10 / 10 / 20 / 60 / 0"),
    ]
    assert report.memory_rows(study, top=1)[0][0] == "1"
    html = report.memory_html(study)
    assert 'id="memory"' in html and "+25%" in html and "skipped" in html
    assert "no trial recorded a memory estimate" in report.memory_html(make_study(str(tmp_path / "s.db"), n=2))


def test_a_script_studys_alone_figure_is_in_the_summary(tmp_path: Path) -> None:
    """The figure a script study gives is its script alone, as written against the export applied."""
    from autotune.core.paired import Paired
    from autotune.search.store import last_word as alone

    study = make_study(str(tmp_path / "s.db"), n=2, ablation=False)
    paired = Paired.of([1.3, 1.4, 1.2])
    verdict = paired.statement(than="the script as written")
    alone.write(study, {"trial": 1, **paired.to_dict(), "verdict": verdict, "exported": "the patched script"})
    html = report.write_report(study, tmp_path / "r" / "report.html")[0].read_text()
    assert "your script alone" in html and "faster than the script as written: x1.30 (x1.20..x1.40" in html
