"""autotune/config.py: every bad TrialConfig value is a ConfigError; dict round-trips; durations; SearchSettings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from autotune.core.config import KNOBS, WORKLOAD, TrialConfig
from autotune.core.settings import SearchSettings, parse_duration
from autotune.core.errors import ConfigError

BAD_VALUES: list[dict[str, Any]] = [
    {"num_workers": -1},
    {"num_workers": 1.5},
    {"num_workers": "2"},
    {"num_workers": None},
    {"pin_memory": "yes"},
    {"pin_memory": 1},
    {"batch_size": 0},
    {"batch_size": True},  # a bool is not a batch size, although bool subclasses int
    {"batch_size": 8.0},
    {"batch_size": None},
    {"precision": "fp8"},
    {"precision": "FP16"},
    {"optimizer_fusion": "fast"},
    {"checkpoint_segments": -1},
    {"gpus": 0},
    {"channels_last": "true"},
    {"cudnn_benchmark": None},
    {"compile": "on"},
    {"compile": False},
    {"persistent_workers": True},  # needs num_workers > 0
    {"prefetch_factor": 2},  # needs num_workers > 0
    {"num_workers": 2, "prefetch_factor": 0},
    {"num_workers": 2, "prefetch_factor": 2.5},
    {"set_to_none": "no"},
    {"num_threads": -2},
    {"pipeline": ""},
    {"pipeline": 3},
    {"image_size": 16},
    {"image_size": 64.0},
    {"warmup_steps": -1},
    {"timed_steps": 0},
    {"window": 0},
    {"seconds": 0},
    {"seconds": -3.0},
    {"seconds": "10"},
    {"seed": "zero"},
    {"lr": 0},
    {"lr": -1e-3},
    {"lr": "fast"},
    {"lr": math.nan},
    {"profile": "yes"},
    {"parallel": "zero3"},
    {"parallel": True},
    {"fsdp_reshard": "yes"},
    {"fsdp_param_dtype": "fp16"},
    {"fsdp_reduce_dtype": "bfloat16"},
    {"fsdp_offload": 1},
]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=lambda d: ",".join(f"{k}={v!r}" for k, v in d.items()))
def test_each_bad_value_is_a_config_error(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        TrialConfig(**bad)
    with pytest.raises(ConfigError):  # the same through the dict path every file reader uses
        TrialConfig.from_dict(bad)


@pytest.mark.parametrize(
    "text, word",
    [("precision: fp8\n", "precision"), ("batch_size: 0\n", "batch_size"), ("batch_sise: 4\n", "batch_sise")],
)
def test_bad_config_file_is_exit_2_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, word: str
) -> None:
    """A ConfigError reaches the user as bad input: exit 2, one line naming the key, no traceback, no trial run."""
    from autotune.cli import main

    path = tmp_path / "file.yaml"
    path.write_text(text)
    code = main(["trial", "--config", str(path)])
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("autotune: error:") and word in lines[0]
    assert not (tmp_path / "trial").exists()  # refused before any trial folder was made


def test_defaults_are_valid_and_a_plain_script() -> None:
    cfg = TrialConfig()
    assert (cfg.precision, cfg.optimizer_fusion, cfg.compile, cfg.checkpoint_segments, cfg.gpus) == (
        "fp32",
        "none",
        "off",
        0,
        1,
    )


def test_good_values_are_accepted() -> None:
    cfg = TrialConfig(
        num_workers=4,
        pin_memory=True,
        batch_size=16,
        precision="bf16",
        optimizer_fusion="fused",
        checkpoint_segments=3,
        gpus=2,
        channels_last=True,
        cudnn_benchmark=True,
        compile="default",
        persistent_workers=True,
        prefetch_factor=4,
        set_to_none=False,
        num_threads=2,
        seconds=2.5,
        lr=3e-4,
    )
    assert cfg.knobs()["prefetch_factor"] == 4 and cfg.lr == 3e-4


def test_knobs_and_workload_partition_the_fields() -> None:
    cfg = TrialConfig()
    assert set(cfg.knobs()) == set(KNOBS)
    assert set(cfg.workload()) == set(WORKLOAD)
    assert set(KNOBS) | set(WORKLOAD) == set(cfg.to_dict())
    assert not set(KNOBS) & set(WORKLOAD)


def test_flat_dict_round_trip() -> None:
    cfg = TrialConfig(num_workers=2, prefetch_factor=3, precision="bf16", data_dir="/d", seconds=4.0)
    assert TrialConfig.from_dict(cfg.to_dict()) == cfg


def test_from_dict_accepts_an_exported_mapping() -> None:
    cfg = TrialConfig(num_workers=3, batch_size=4, precision="bf16", image_size=96, data_dir="/data", lr=1e-4)
    exported = {
        "config": cfg.knobs(),
        "workload": cfg.workload(),
        "metrics": {"samples_per_s": 12.0},
        "speedup": 1.5,
    }  # other sections are ignored
    assert TrialConfig.from_dict(exported) == cfg


def test_from_dict_exported_without_workload_keeps_workload_defaults() -> None:
    got = TrialConfig.from_dict({"config": {"batch_size": 4}})
    assert got == TrialConfig(batch_size=4)


def test_from_dict_rejects_unknown_keys_naming_them() -> None:
    with pytest.raises(ConfigError, match="num_wrokers"):
        TrialConfig.from_dict({"num_wrokers": 2})
    with pytest.raises(ConfigError, match="bogus"):
        TrialConfig.from_dict({"config": {"bogus": 1}, "workload": {}})


def test_from_dict_rejects_a_non_mapping() -> None:
    with pytest.raises(ConfigError):
        TrialConfig.from_dict([("batch_size", 2)])  # type: ignore[arg-type]


def test_replace_validates() -> None:
    with pytest.raises(ConfigError):
        TrialConfig().replace(batch_size=0)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("2h", 7200),
        ("90m", 5400),
        ("1h30m", 5400),
        ("45s", 45),
        ("10", 10),
        ("1.5h", 5400),
        ("1h0m30s", 3630),
        (" 2H ", 7200),
        ("0.5", 0.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5", "2x", "", "h", "0s", "0h0m", "1d", "m30", "1 h", "abc"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


@pytest.mark.parametrize(
    "bad",
    [
        {"budget_s": 0},
        {"budget_s": -1},
        {"budget_s": math.inf},
        {"budget_s": math.nan},
        {"budget_s": "2h"},
        {"budget_s": 60, "sampler": "cmaes"},
        {"budget_s": 60, "trial_timeout_s": 0},
        {"budget_s": 60, "trial_timeout_s": -5},
        {"budget_s": 60, "n_trials": 0},
        {"budget_s": 60, "study": ""},
        {"budget_s": 60, "study": "a/b"},
    ],
)
def test_search_settings_rejects(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SearchSettings(**bad)


def test_search_settings_trial_timeout() -> None:
    assert SearchSettings(budget_s=60).trial_timeout == 120  # never less than two minutes
    assert SearchSettings(budget_s=7200).trial_timeout == 1800  # a quarter of the budget
    assert SearchSettings(budget_s=7200, trial_timeout_s=90).trial_timeout == 90
    s = SearchSettings(budget_s=60, sampler="random", n_trials=3, study="mine")
    assert s.base == TrialConfig() and s.storage is None
