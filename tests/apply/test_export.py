"""autotune/export.py: the native YAML round-trips, framework renderings name real fields, URLs are masked."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import yaml

from autotune.core.config import KNOBS, WORKLOAD, TrialConfig
from autotune.core.result import TrialResult
from autotune.core.errors import AutotuneError, ConfigError
from autotune.apply.export import FORMATS, render, to_accelerate, to_hf, to_lightning
from autotune.core.configfile import Export, load_config, to_yaml
from autotune.core.files import write_atomic
from autotune.core.urls import mask_url

# Every knob and workload field away from its default, so a dropped field cannot pass by accident.
TUNED = TrialConfig(
    num_workers=3,
    pin_memory=True,
    batch_size=12,
    precision="bf16",
    optimizer_fusion="fused",
    checkpoint_segments=2,
    gpus=2,
    channels_last=True,
    cudnn_benchmark=True,
    compile="off",
    persistent_workers=True,
    prefetch_factor=4,
    set_to_none=False,
    num_threads=6,
    pipeline="tests.fake:make",
    data_dir="/data/people",
    image_size=96,
    warmup_steps=2,
    timed_steps=7,
    seconds=12.5,
    window=3,
    seed=11,
    lr=3e-4,
    profile=True,
)

CONFIGS = [
    TrialConfig(),
    TUNED,
    TUNED.replace(
        precision="fp16",
        optimizer_fusion="apex",
        compile="max-autotune",
        gpus=1,
        checkpoint_segments=0,
        channels_last=False,
        num_threads=0,
    ),
    TUNED.replace(precision="fp32", optimizer_fusion="foreach", compile="default"),
    TUNED.replace(
        parallel="fsdp", fsdp_reshard=False, fsdp_param_dtype="bf16", fsdp_reduce_dtype="bf16", fsdp_offload=True
    ),
]


def make_export(cfg: TrialConfig = TUNED, device: str = "cuda") -> Export:
    return Export(
        config=cfg,
        metrics={"samples_per_s": 42.0, "step_time_p50": 0.25, "peak_memory_bytes": 123456, "data_wait_fraction": 0.05},
        baseline_samples_per_s=21.0,
        speedup=2.0,
        environment={"device": device, "torch": "2.14.1", "gpu_names": ("H200", "H200")},
        study={"name": "demo", "trial": 7, "storage": "postgresql://bob:hunter2@db.example/studies"},
        reproduce="autotune trial --config best.yaml",
    )


# ---------------------------------------------------------------------------------------- yaml


@pytest.mark.parametrize("cfg", CONFIGS, ids=["baseline", "tuned", "fp16-apex", "fp32-foreach", "fsdp"])
def test_yaml_round_trips_every_field(tmp_path: Path, cfg: TrialConfig) -> None:
    path = tmp_path / "best.yaml"
    write_atomic(path, to_yaml(make_export(cfg)))
    back = load_config(path)
    assert back == cfg
    for name in (*KNOBS, *WORKLOAD):
        assert getattr(back, name) == getattr(cfg, name), name


def test_yaml_has_every_section_in_order() -> None:
    text = to_yaml(make_export())
    data = yaml.safe_load(text)
    assert list(data) == ["config", "workload", "metrics", "baseline", "speedup", "environment", "study", "reproduce"]
    assert list(data["config"]) == list(KNOBS)
    assert list(data["workload"]) == list(WORKLOAD)
    assert data["metrics"]["samples_per_s"] == 42.0
    assert set(data["metrics"]) >= {"samples_per_s", "step_time_p50", "peak_memory_bytes", "data_wait_fraction"}
    assert data["baseline"] == {"samples_per_s": 21.0}
    assert data["speedup"] == 2.0
    assert data["study"]["name"] == "demo" and data["study"]["trial"] == 7
    assert data["environment"]["gpu_names"] == ["H200", "H200"]
    assert data["reproduce"] == "autotune trial --config best.yaml"
    # the header says how to apply it
    assert "autotune trial --config best.yaml" in text
    assert "autotune train --config best.yaml" in text


def test_yaml_quotes_off_and_masks_storage() -> None:
    text = to_yaml(make_export(TUNED.replace(compile="off")))
    assert "compile: 'off'" in text  # bare `off` would read back as False
    assert "hunter2" not in text
    assert "postgresql://bob:***@db.example/studies" in text


def test_export_from_result_computes_speedup() -> None:
    result = TrialResult(
        status="ok",
        samples_per_s=30.0,
        step_time_p50=0.2,
        peak_memory_bytes=10,
        data_wait_fraction=0.1,
        device="cpu",
        world_size=1,
    )
    e = Export.from_result(TUNED, result, baseline_samples_per_s=10.0, study={"name": "s"})
    assert e.speedup == pytest.approx(3.0)
    assert e.metrics["samples_per_s"] == 30.0
    assert e.environment["device"] == "cpu"
    assert Export.from_result(TUNED, result).speedup is None


# ---------------------------------------------------------------------------------- load_config


def test_load_flat_yaml_and_json(tmp_path: Path) -> None:
    flat = tmp_path / "flat.yaml"
    flat.write_text("num_workers: 2\nprecision: bf16\nprefetch_factor: 3\n")
    assert load_config(flat) == TrialConfig(num_workers=2, precision="bf16", prefetch_factor=3)
    js = tmp_path / "config.json"
    js.write_text(json.dumps(TUNED.to_dict()))
    assert load_config(js) == TUNED


def test_load_hand_written_bare_off(tmp_path: Path) -> None:
    p = tmp_path / "hand.yaml"
    p.write_text("compile: off\nbatch_size: 4\n")  # YAML 1.1 reads `off` as false
    assert load_config(p) == TrialConfig(batch_size=4, compile="off")


@pytest.mark.parametrize(
    "name, text",
    [
        ("bad.yaml", "num_workers: [1, 2\n"),
        ("list.yaml", "- num_workers\n- batch_size\n"),
        ("empty.yaml", ""),
        ("unknown.yaml", "num_workers: 2\nwarp_speed: 9\n"),
        ("badvalue.yaml", "precision: fp8\n"),
        ("badtype.yaml", "num_workers: lots\n"),
        ("bad.json", "{not json"),
        ("exported-bad.yaml", "config:\n  batch_size: 0\nworkload: {}\n"),
    ],
)
def test_load_config_errors_name_the_file(tmp_path: Path, name: str, text: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    msg = str(info.value)
    assert name in msg
    assert "\n" not in msg


def test_load_config_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nowhere" / "best.yaml"
    with pytest.raises(ConfigError, match="best.yaml"):
        load_config(p)


def test_load_config_unknown_knob_is_named(tmp_path: Path) -> None:
    p = tmp_path / "u.yaml"
    p.write_text("warp_speed: 9\n")
    with pytest.raises(ConfigError, match="warp_speed"):
        load_config(p)


def test_load_config_never_runs_yaml_tags(tmp_path: Path) -> None:
    p = tmp_path / "evil.yaml"
    p.write_text("num_workers: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="evil.yaml"):
        load_config(p)


# ------------------------------------------------------------------------------------- mask_url


@pytest.mark.parametrize(
    "url, expected",
    [
        ("postgresql://u:secret@h/db", "postgresql://u:***@h/db"),
        (
            "postgresql+psycopg://alice:s3cr3t@db.example:5432/optuna",
            "postgresql+psycopg://alice:***@db.example:5432/optuna",
        ),
        ("mysql://root:p@ss@localhost/x", "mysql://root:***@localhost/x"),
        ("redis://:secret@cache:6379/0", "redis://:***@cache:6379/0"),
    ],
)
def test_mask_url_masks_password(url: str, expected: str) -> None:
    assert mask_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "studies.db",
        "/abs/path/studies.db",
        "sqlite:///studies.db",
        "sqlite:////abs/path/x.db",
        "postgresql://u@h/db",
        "postgresql://h/db",
        "",
    ],
)
def test_mask_url_leaves_passwordless_alone(url: str) -> None:
    assert mask_url(url) == url


@pytest.mark.parametrize(
    "url, secret",
    [
        ("postgresql://u:hunter2@h/db", "hunter2"),
        ("postgresql://u:pa/ss#word@h/db", "pa/ss#word"),
        ("postgresql://u:s%40cret@h/db?sslmode=require", "s%40cret"),
        ("postgresql://h/db?user=u&password=topsecret", "topsecret"),
    ],
)
def test_mask_url_never_shows_password(url: str, secret: str) -> None:
    masked = mask_url(url)
    assert secret not in masked
    assert "***" in masked


# ------------------------------------------------------------------------- framework renderings


@pytest.mark.parametrize("cfg", CONFIGS, ids=["baseline", "tuned", "fp16-apex", "fp32-foreach", "fsdp"])
@pytest.mark.parametrize("render_fn", [to_lightning, to_hf, to_accelerate], ids=["lightning", "hf", "accelerate"])
def test_every_knob_is_mentioned(cfg: TrialConfig, render_fn) -> None:
    text = render_fn(cfg)
    for knob in KNOBS:
        assert knob in text, f"{knob} missing from {render_fn.__name__}"


@pytest.mark.parametrize("cfg", CONFIGS, ids=["baseline", "tuned", "fp16-apex", "fp32-foreach", "fsdp"])
def test_python_snippets_parse(cfg: TrialConfig) -> None:
    """The configs a CPU cannot train (test_export_frameworks.py trains one of each) must still be Python."""
    for device in (None, "cpu"):
        ast.parse(to_lightning(cfg, device=device))
        ast.parse(to_hf(cfg, device=device))
        rendered = to_accelerate(cfg, device=device)
        script = rendered[rendered.index("# In train.py") :].splitlines()[1:]
        ast.parse("\n".join(line[4:] for line in script if line.startswith("#   ")))


def _dict_call(text: str, name: str) -> dict:
    """Evaluate `name = dict(...)` from a snippet without running the rest of it."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            call = node.value
            assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "dict"
            return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    raise AssertionError(f"{name} not found")


def test_lightning_fields() -> None:
    """What the CPU-trained export cannot show: the GPU/DDP layout, the other precisions, compile, apex."""
    text = to_lightning(TUNED, device="cuda")
    trainer = _dict_call(text, "trainer_kwargs")
    assert trainer == {
        "accelerator": "gpu",
        "devices": 2,
        "strategy": "ddp",
        "precision": "bf16-mixed",
        "benchmark": True,
        "accumulate_grad_batches": 1,
    }
    # Global batch 12 x 2 = 24, three times the baseline's 8: lr 3e-4 scaled by sqrt(3), the rule named.
    assert f"torch.optim.AdamW(self.parameters(), lr={3e-4 * 3**0.5!r}, weight_decay=0.01, fused=True)" in text
    assert "scaled by the sqrt rule for 24" in text
    single = _dict_call(to_lightning(TrialConfig(precision="fp16")), "trainer_kwargs")
    assert "strategy" not in single and single["precision"] == "16-mixed" and single["accelerator"] == "auto"
    assert _dict_call(to_lightning(TrialConfig()), "trainer_kwargs")["precision"] == "32-true"
    assert "torch.compile(model, mode='max-autotune')" in to_lightning(TUNED.replace(compile="max-autotune"))
    assert "apex.optimizers.FusedAdam" in to_lightning(TUNED.replace(optimizer_fusion="apex"))
    assert "def setup(self, stage)" not in to_lightning(TrialConfig())  # channels_last off: no hook


def test_hf_fields() -> None:
    """What the CPU-trained export cannot show: compile, fp16, the optim names of the other fusions."""
    text = to_hf(TUNED.replace(compile="max-autotune"))
    args = _dict_call(text, "training_args")
    assert args["torch_compile"] is True and args["torch_compile_mode"] == "max-autotune"
    assert args["weight_decay"] == 0.01 and args["lr_scheduler_type"] == "constant"
    assert "every layer" in text
    assert "torchrun --nproc-per-node 2" in text
    for fusion, optim in [("none", "adamw_torch"), ("foreach", "adamw_torch"), ("apex", "adamw_apex_fused")]:
        assert _dict_call(to_hf(TUNED.replace(optimizer_fusion=fusion)), "training_args")["optim"] == optim
    base = _dict_call(to_hf(TrialConfig()), "training_args")
    assert base["bf16"] is False and base["fp16"] is False
    assert base["gradient_checkpointing"] is False and base["torch_compile"] is False
    assert "torch_compile_mode" not in base and "use_cpu" not in base
    assert _dict_call(to_hf(TrialConfig(precision="fp16")), "training_args")["fp16"] is True


def test_accelerate_fields() -> None:
    data = yaml.safe_load(to_accelerate(TUNED.replace(compile="max-autotune")))
    assert data["compute_environment"] == "LOCAL_MACHINE"
    assert data["distributed_type"] == "MULTI_GPU"
    assert data["num_processes"] == 2
    assert data["mixed_precision"] == "bf16"
    assert data["dynamo_config"] == {
        "dynamo_backend": "INDUCTOR",
        "dynamo_mode": "max-autotune",
        "dynamo_use_dynamic": False,
        "dynamo_use_fullgraph": False,
    }
    base_text = to_accelerate(TrialConfig())
    base = yaml.safe_load(base_text)
    # 'NO' and 'no' must stay strings: YAML 1.1 would read them bare as false
    assert base["distributed_type"] == "NO"
    assert base["mixed_precision"] == "no"
    assert base["num_processes"] == 1
    assert "dynamo_config" not in base
    assert yaml.safe_load(to_accelerate(TrialConfig(precision="fp16")))["mixed_precision"] == "fp16"
    cpu = yaml.safe_load(to_accelerate(TUNED, device="cpu"))
    assert cpu["distributed_type"] == "MULTI_CPU" and cpu["use_cpu"] is True
    # the knobs accelerate does not hold are listed in comments, and given as the script's part
    assert "DataLoader(num_workers=...)" in base_text
    assert "#   accelerator = Accelerator(gradient_accumulation_steps=1)" in base_text


# --------------------------------------------------------------------------------------- render


def test_render_dispatches_every_format(tmp_path: Path) -> None:
    e = make_export(device="cpu")
    assert FORMATS == ("yaml", "lightning", "hf", "accelerate", "script", "diff")
    assert render("yaml", e) == to_yaml(e)
    assert render("lightning", e) == to_lightning(e.config, device="cpu")
    assert render("hf", e) == to_hf(e.config, device="cpu")
    assert render("accelerate", e) == to_accelerate(e.config, device="cpu")
    for fmt in FORMATS[:-2]:
        assert "hunter2" not in render(fmt, e)
    with pytest.raises(AutotuneError, match="--format script needs a script study"):
        render("script", e)  # a unet study: tests/pipelines/test_script.py renders a script's


def test_render_unknown_format() -> None:
    with pytest.raises(ConfigError, match="toml"):
        render("toml", make_export())


# ---------------------------------------------------------------------------------- write_atomic


def test_write_atomic_creates_dirs_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "studies" / "demo" / "best.yaml"
    write_atomic(target, "a: 1\n")
    write_atomic(target, "a: 2\n")
    assert target.read_text() == "a: 2\n"
    assert os.listdir(target.parent) == ["best.yaml"]
    assert target.stat().st_mode & 0o644 == 0o644


def test_write_atomic_cleans_up_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "best.yaml"
    target.write_text("old\n")

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["best.yaml"]


@pytest.mark.parametrize(
    "device, accelerator, use_cpu",
    [
        ("NVIDIA H200", "gpu", False),  # what a GPU trial records: the device's name, not "cuda"
        ("Tesla V100-SXM2-16GB", "gpu", False),
        ("cpu", "cpu", True),
    ],
)
def test_exports_recognise_the_device_a_trial_recorded(device: str, accelerator: str, use_cpu: bool) -> None:
    e = make_export(TUNED.replace(gpus=1), device=device)
    assert f"accelerator={accelerator!r}" in render("lightning", e)
    assert yaml.safe_load(render("accelerate", e))["use_cpu"] is use_cpu


def test_apex_exports_construct_and_zero_grad_as_apex_takes_it() -> None:
    e = make_export(TUNED.replace(optimizer_fusion="apex", set_to_none=True))
    light = render("lightning", e)
    assert "weight_decay=0.01, set_grad_none=True" in light
    assert "optimizer.zero_grad()" in light and "zero_grad(set_to_none" not in light  # apex's takes no argument


def test_exports_carry_the_accumulation_and_the_scaled_lr() -> None:
    fixed = TUNED.replace(global_batch=96, lr_scaling="linear")  # 12 x 2 processes x 4 accumulation steps
    assert fixed.grad_accum == 4 and fixed.effective_lr == fixed.lr  # the study's global batch: lr as given
    assert _dict_call(to_lightning(fixed, device="cuda"), "trainer_kwargs")["accumulate_grad_batches"] == 4
    hf = _dict_call(to_hf(fixed, device="cuda"), "training_args")
    assert hf["gradient_accumulation_steps"] == 4 and hf["learning_rate"] == fixed.lr
    assert "Accelerator(gradient_accumulation_steps=4)" in to_accelerate(fixed, device="cuda")
    free = TUNED.replace(batch_size=32, gpus=1, lr_scaling="linear")  # global 32 vs the baseline's 8: lr x 4
    assert _dict_call(to_hf(free, device="cuda"), "training_args")["learning_rate"] == 4 * free.lr
    assert "scaled by the linear rule" in to_accelerate(free)


# ------------------------------------------------------------------------------------ the strategy

FSDP = TUNED.replace(parallel="fsdp", fsdp_reshard=False, fsdp_reduce_dtype="bf16", fsdp_offload=True)


def test_every_format_names_the_fsdp_strategy() -> None:
    from autotune.apply.export import to_accelerate, to_hf, to_lightning

    assert "parallel: fsdp" in to_yaml(make_export(FSDP))
    acc = yaml.safe_load(to_accelerate(FSDP, device="cuda"))
    assert acc["distributed_type"] == "FSDP" and acc["fsdp_config"]["fsdp_version"] == 2
    assert (
        acc["fsdp_config"]["fsdp_reshard_after_forward"] is False and acc["fsdp_config"]["fsdp_offload_params"] is True
    )
    assert "reduce_dtype=torch.bfloat16" in to_accelerate(FSDP)
    hf = to_hf(FSDP)
    assert "fsdp=True," in hf and "'version': 2, 'reshard_after_forward': False, 'cpu_offload': True" in hf
    assert "reduce_dtype=torch.bfloat16" in hf  # no TrainingArguments field: said, not dropped
    lightning = to_lightning(FSDP)
    assert "strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)" in lightning
    assert (
        "fully_shard(block, reshard_after_forward=False, mp_policy=mp, offload_policy=CPUOffloadPolicy())" in lightning
    )


def test_ddp_and_one_process_exports_say_nothing_of_fsdp() -> None:
    from autotune.apply.export import to_accelerate, to_hf, to_lightning

    for cfg in (TUNED, TUNED.replace(gpus=1), FSDP.replace(gpus=1)):
        acc = yaml.safe_load(to_accelerate(cfg))
        assert acc["distributed_type"] != "FSDP" and "fsdp_config" not in acc
        assert "fsdp=True" not in to_hf(cfg) and "ModelParallelStrategy" not in to_lightning(cfg)
    assert "strategy='ddp'" in to_lightning(TUNED)
