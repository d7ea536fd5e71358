"""benchmarks/lightning_export.py, without its search: bad input is one line and exit 2, and its user runs
(the user's own Trainer.fit, outside autotune) apply a tuned_lightning.py rendered by autotune's own
`export --format lightning`, each knob read back from the run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lightning")

from autotune.apply.export import render  # noqa: E402
from autotune.core.config import TrialConfig  # noqa: E402
from autotune.core.result import TrialResult  # noqa: E402
from autotune.core.configfile import Export  # noqa: E402
from benchmarks import lightning_export as bench  # noqa: E402


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "studies.db").write_text("")
    for argv in (
        ["--rounds", "0"],
        ["--budget", "soon"],
        ["--out", str(tmp_path / "used")],
        ["--search-args=--storage=x.db"],
    ):
        assert bench.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "bad input" in err, argv
    monkeypatch.setattr(bench, "installed", lambda module: module != "lightning")
    assert bench.main(["--out", str(tmp_path / "new")]) == 2
    assert "PyTorch Lightning is not installed" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # nothing written


@pytest.mark.slow
def test_user_runs_apply_the_rendered_export(tmp_path: Path) -> None:
    framework = {
        "library": "lightning",
        "trainer_kwargs": {
            "accelerator": "cpu",
            "devices": 1,
            "strategy": "auto",
            "precision": "32-true",
            "accumulate_grad_batches": 2,
            "benchmark": False,
        },
        "dataloader_kwargs": {
            "batch_size": 4,
            "num_workers": 1,
            "pin_memory": False,
            "persistent_workers": True,
            "prefetch_factor": 2,
        },
        "lr_scale": 1.0,
    }
    cfg = TrialConfig(
        pipeline=bench.PIPELINE,
        batch_size=4,
        global_batch=8,
        num_workers=1,
        persistent_workers=True,
        prefetch_factor=2,
        num_threads=1,
    )
    result = TrialResult(status="ok", samples_per_s=2.0, applied={"framework": framework})
    (tmp_path / bench.EXPORT).write_text(
        render("lightning", Export.from_result(cfg, result, baseline_samples_per_s=1.0))
    )

    base = bench.user_run("baseline", tmp_path, 0, 4, 1.0)
    tuned = bench.user_run("tuned", tmp_path, 0, 4, 1.0)
    # The same samples timed: 4 steps of 8, and 4 optimizer steps of 2 micro-batches of 4.
    assert base["samples"] == tuned["samples"] == 32
    assert (base["batch_size"], base["num_workers"], base["trainer_kwargs"]) == (8, 0, {})
    assert (tuned["batch_size"], tuned["num_workers"], tuned["timed_steps"]) == (4, 1, 4)
    assert tuned["trainer_kwargs"] == framework["trainer_kwargs"]
    assert tuned["dataloader_kwargs"] == framework["dataloader_kwargs"]
    assert tuned["threads"] == 1  # the export's torch.set_num_threads(1) line ran on import
    assert base["samples_per_s"] > 0 and tuned["samples_per_s"] > 0
