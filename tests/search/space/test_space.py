from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path

import optuna
import pytest

from autotune.core.config import BASELINE, KNOBS, TrialConfig
from autotune.core.errors import SearchSpaceError
from autotune.search.space.spec import Choices, Fixed, IntRange, SearchSpace
from autotune.search.space.machine import Hardware
from autotune.search.space.resolve import for_hardware
from autotune.search.space.reading import load_space
from autotune.search.space.suggest import config_params, suggest

DEFAULT = Path(__file__).resolve().parents[3] / "search_spaces" / "default.yaml"
CPU = Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False)
GPU4 = Hardware(cuda=True, gpu_count=4, cpu_count=16, apex=False)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_default_has_every_knob() -> None:
    space = load_space(DEFAULT)
    assert set(space.knobs) == set(KNOBS)
    assert space["compile"] == Choices(("off", "default", "reduce-overhead", "max-autotune"))
    assert space["num_workers"] == IntRange(0, 8)
    assert space["pin_memory"] == Choices((False, True))
    assert "apex" in space["optimizer_fusion"].values  # type: ignore[union-attr]
    assert space.grid_size() > 1


@pytest.mark.parametrize(
    "body, knob, words",
    [
        ("knobs:\n  precison: [fp32]\n", "precison", "unknown knob"),
        ("knobs:\n  batch_size: [8, x]\n", "batch_size", "integer"),
        ("knobs:\n  batch_size: [8, 4.5]\n", "batch_size", "integer"),
        ("knobs:\n  pin_memory: [true, 1]\n", "pin_memory", "true or false"),
        ("knobs:\n  precision: [fp32, fp8]\n", "precision", "fp8"),
        ("knobs:\n  optimizer_fusion: fusedd\n", "optimizer_fusion", "fusedd"),
        ("knobs:\n  compile: [true]\n", "compile", "quote"),
        ("knobs:\n  batch_size: []\n", "batch_size", "empty choice list"),
        ("knobs:\n  batch_size: [8, 8]\n", "batch_size", "duplicate"),
        ("knobs:\n  batch_size: 0\n", "batch_size", ">= 1"),
        ("knobs:\n  num_workers: {low: 4, high: 2}\n", "num_workers", "low 4 > high 2"),
        ("knobs:\n  num_workers: {low: 0, high: 8, step: 0}\n", "num_workers", "step"),
        ("knobs:\n  num_workers: {low: 0, high: 8, step: -2}\n", "num_workers", "step"),
        ("knobs:\n  num_workers: {low: 0, high: 7, step: 2}\n", "num_workers", "multiple of step"),
        ("knobs:\n  num_threads: {low: 0, high: 8, log: true}\n", "num_threads", "low >= 1"),
        ("knobs:\n  batch_size: {low: 4, high: 64, log: yes_please}\n", "batch_size", "log"),
        ("knobs:\n  batch_size: {low: 4, high: 64, log: true, step: 2}\n", "batch_size", "step"),
        ("knobs:\n  precision: {low: 0, high: 1}\n", "precision", "integer knob"),
        ("knobs:\n  pin_memory: {low: 0, high: 1}\n", "pin_memory", "integer knob"),
        ("knobs:\n  num_workers: {low: 0, hgh: 8}\n", "num_workers", "hgh"),
        ("knobs:\n  num_workers: {low: 0}\n", "num_workers", "low and high"),
        ("knobs:\n  gpus: {low: 0, high: 2}\n", "gpus", ">= 1"),
        ("knobs:\n  num_workers: 0\n  prefetch_factor: [2, 4]\n", "prefetch_factor", "num_workers is fixed to 0"),
        ("knobs:\n  num_workers: [0]\n  persistent_workers: [false, true]\n", "persistent_workers", "num_workers"),
        ("knobs:\n  persistent_workers: true\n", "persistent_workers", "num_workers"),  # omitted = 0
    ],
)
def test_validation_errors_name_file_and_knob(tmp_path: Path, body: str, knob: str, words: str) -> None:
    p = write(tmp_path, body, "bad_space.yaml")
    with pytest.raises(SearchSpaceError) as e:
        load_space(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert "bad_space.yaml" in msg and f"'{knob}'" in msg and words in msg, msg


@pytest.mark.parametrize(
    "body, words",
    [
        (None, "not found"),
        ("knobs: [a\n  b: }", "malformed YAML"),
        ("- 1\n- 2\n", "top level must be a mapping"),
        ("knobs: 3\n", "'knobs:' must be a mapping"),
        ("batch_size: [8]\n", "unknown top-level key"),
        ("", "top level must be a mapping"),
    ],
)
def test_file_level_errors(tmp_path: Path, body: str | None, words: str) -> None:
    p = tmp_path / "broken.yaml"
    if body is not None:
        p.write_text(body)
    with pytest.raises(SearchSpaceError) as e:
        load_space(p)
    msg = str(e.value)
    assert "\n" not in msg and "broken.yaml" in msg and words in msg, msg


def test_yaml11_tolerance_and_omitted_knobs(tmp_path: Path) -> None:
    space = load_space(
        write(
            tmp_path,
            "knobs:\n  compile: [off, default]\n  set_to_none: true\n"
            "  prefetch_factor: [null, 2]\n  num_workers: [0, 2]\n",
        )
    )
    assert space["compile"] == Choices(("off", "default"))
    assert space["set_to_none"] == Fixed(True)
    assert set(space.knobs) == {"compile", "set_to_none", "prefetch_factor", "num_workers"}
    # an inert worker knob next to num_workers: 0 is harmless
    load_space(write(tmp_path, "knobs:\n  num_workers: 0\n  persistent_workers: false\n", "ok.yaml"))


def test_resolve_cpu() -> None:
    space, notes = for_hardware(load_space(DEFAULT), CPU)
    assert space["precision"] == Choices(("fp32", "bf16"))
    assert space["pin_memory"] == Fixed(False)
    assert space["cudnn_benchmark"] == Fixed(False)
    assert space["compile"] == Fixed("off")
    assert "apex" not in space["optimizer_fusion"].values  # type: ignore[union-attr]
    assert space["gpus"] == Fixed(1)
    assert space["num_workers"] == IntRange(0, 2)
    assert space["num_threads"] == IntRange(0, 2)
    assert space["checkpoint_segments"] == load_space(DEFAULT)["checkpoint_segments"]  # stages=None
    text = " ".join(notes)
    for word in ("fp16", "pin_memory", "cudnn_benchmark", "compile", "apex", "gpus", "num_workers"):
        assert word in text


def test_resolve_cpu_without_bf16_kernels() -> None:
    """An AVX2-only CPU emulates bf16 about 70x slower: searching it would only time trials out."""
    space, notes = for_hardware(
        load_space(DEFAULT), Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False, cpu_bf16=False)
    )
    assert space["precision"] == Fixed("fp32")
    assert any("precision" in n and "native bf16" in n for n in notes)
    # a GPU machine keeps bf16 whatever its CPU has: autocast runs on the GPU
    space, _ = for_hardware(
        load_space(DEFAULT), Hardware(cuda=True, gpu_count=1, cpu_count=8, apex=False, cpu_bf16=False)
    )
    assert "bf16" in space["precision"].values  # type: ignore[union-attr]


def test_cpu_bf16_native_asks_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from autotune.search.space.machine import cpu_bf16_native

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert cpu_bf16_native() is True
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert cpu_bf16_native() is False


def test_resolve_gpu() -> None:
    space, notes = for_hardware(load_space(DEFAULT), GPU4)
    assert "fp16" in space["precision"].values  # type: ignore[union-attr]
    assert space["gpus"] == IntRange(1, 4)
    assert space["compile"] == Choices(("off", "default", "reduce-overhead", "max-autotune"))
    assert space["pin_memory"] == Choices((False, True))
    assert space["num_workers"] == IntRange(0, 8)
    assert any("gpus" in n for n in notes)


def test_resolve_apex_kept_when_installed() -> None:
    space, _ = for_hardware(load_space(DEFAULT), Hardware(cuda=True, gpu_count=1, cpu_count=8, apex=True))
    assert "apex" in space["optimizer_fusion"].values  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body, words",
    [
        ("knobs:\n  gpus: 4\n", "gpus=4 but only 1 device present"),
        ("knobs:\n  gpus: [2, 4]\n", "gpus=2 but only 1 device present"),
        ("knobs:\n  gpus: {low: 2, high: 4}\n", "only 1 device present"),
        ("knobs:\n  precision: fp16\n", "choices conflict with the hardware"),
        ("knobs:\n  optimizer_fusion: [apex]\n", "choices conflict with the hardware"),
    ],
)
def test_resolve_conflicts(tmp_path: Path, body: str, words: str) -> None:
    space = load_space(write(tmp_path, body, "hw.yaml"))
    with pytest.raises(SearchSpaceError) as e:
        for_hardware(space, CPU)
    assert words in str(e.value) and "hw.yaml" in str(e.value)


def test_resolve_gpu_choices_filtered(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "knobs:\n  gpus: [1, 2, 8]\n"))
    assert for_hardware(space, GPU4)[0]["gpus"] == Choices((1, 2))


def test_resolve_stages_and_unsupported() -> None:
    base = load_space(DEFAULT)
    space, notes = for_hardware(base, CPU, stages=0)
    assert space["checkpoint_segments"] == Fixed(0)
    assert any("pipeline declares no stages" in n for n in notes)
    space, _ = for_hardware(base, CPU, stages=4)
    assert space["checkpoint_segments"] == Choices((0, 2, 4))
    space, notes = for_hardware(base, GPU4, unsupported=frozenset({"channels_last", "num_workers"}))
    assert space["channels_last"] == Fixed(False)
    assert space["num_workers"] == Fixed(0)
    # with no workers the worker-only knobs become inert rather than sampled for nothing
    assert space["prefetch_factor"] == Fixed(None) and space["persistent_workers"] == Fixed(False)
    assert any("channels_last" in n for n in notes)


def test_resolve_workers_clip_fixed_and_choices(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "knobs:\n  num_workers: [1, 4, 8]\n  num_threads: 6\n"))
    r, _ = for_hardware(space, CPU)
    assert r["num_workers"] == Choices((1, 2)) and r["num_threads"] == Fixed(2)


def _check(cfg: TrialConfig, space: SearchSpace, params: dict) -> None:
    assert isinstance(cfg, TrialConfig)
    for k, spec in space.knobs.items():
        v = getattr(cfg, k)
        if isinstance(spec, Fixed):
            assert v == spec.value and k not in params
        elif k in ("prefetch_factor", "persistent_workers") and cfg.num_workers == 0:
            assert k not in params
        elif isinstance(spec, Choices):
            assert v in spec.values and type(v) in {type(c) for c in spec.values}
        else:
            assert spec.low <= v <= spec.high
    if cfg.num_workers == 0:
        assert cfg.prefetch_factor is None and cfg.persistent_workers is False
        assert "prefetch_factor" not in params and "persistent_workers" not in params


@pytest.mark.parametrize("hw", [CPU, GPU4])
def test_suggest_30_trials(hw: Hardware) -> None:
    space, _ = for_hardware(load_space(DEFAULT), hw)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=10))
    study.enqueue_trial({"num_workers": 0})  # both branches of the condition, whatever the sampler draws
    study.enqueue_trial({"num_workers": 2})
    seen_workers = set()
    for i in range(30):
        trial = study.ask()
        cfg = suggest(trial, space, BASELINE)
        _check(cfg, space, trial.params)
        seen_workers.add(cfg.num_workers > 0)
        study.tell(trial, float(cfg.batch_size + i))
    assert seen_workers == {True, False}  # both branches of the condition were exercised


def test_fixed_knobs_not_in_params(tmp_path: Path) -> None:
    space = load_space(
        write(
            tmp_path,
            "knobs:\n  batch_size: 16\n  precision: [bf16]\n  num_workers: {low: 2, high: 2}\n  gpus: [1, 2]\n",
        )
    )
    space, _ = for_hardware(space, GPU4)
    trial = optuna.create_study().ask()
    cfg = suggest(trial, space, BASELINE)
    assert set(trial.params) == {"gpus"}  # no prefetch/persistent: not in this space at all
    assert (cfg.batch_size, cfg.precision, cfg.num_workers) == (16, "bf16", 2)


def test_round_trip() -> None:
    for hw in (None, CPU, GPU4):
        space = load_space(DEFAULT) if hw is None else for_hardware(load_space(DEFAULT), hw, stages=3)[0]
        d = json.loads(json.dumps(space.to_dict()))
        back = SearchSpace.from_dict(d)
        assert back == space
        assert back.grid_size() == space.grid_size()


def test_grid_size() -> None:
    space = SearchSpace({"batch_size": Choices((4, 8)), "num_workers": IntRange(0, 8, 2), "gpus": Fixed(1)})
    assert space.grid_size() == 2 * 5


@pytest.mark.parametrize("hw", [CPU, GPU4])
@pytest.mark.parametrize(
    "cfg",
    [
        BASELINE,
        BASELINE.replace(
            num_workers=2,
            prefetch_factor=4,
            persistent_workers=True,
            batch_size=32,
            precision="bf16",
            optimizer_fusion="fused",
            channels_last=True,
            set_to_none=False,
        ),
    ],
)
def test_enqueued_config_comes_back(hw: Hardware, cfg: TrialConfig) -> None:
    space, _ = for_hardware(load_space(DEFAULT), hw)
    study = optuna.create_study()
    params = config_params(cfg, space)
    assert not {k for k, s in space.knobs.items() if isinstance(s, Fixed)} & set(params)
    if cfg.num_workers == 0:
        assert "prefetch_factor" not in params and "persistent_workers" not in params
    study.enqueue_trial(params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in range: Optuna must not warn about the fixed params
        trial = study.ask()
        assert suggest(trial, space, BASELINE) == cfg
    assert trial.params == params


def test_config_params_out_of_space() -> None:
    space, _ = for_hardware(load_space(DEFAULT), CPU)
    # fp16 was dropped on CPU: left to the sampler instead of failing mid-trial inside suggest_categorical
    params = config_params(BASELINE.replace(precision="fp16", batch_size=16), space)
    assert "precision" not in params and params["batch_size"] == 16
    study = optuna.create_study()
    study.enqueue_trial(params)
    assert suggest(study.ask(), space, BASELINE).batch_size == 16  # no ValueError from Optuna
    # an int outside the range is accepted: Optuna warns and records it as given
    cfg = BASELINE.replace(num_threads=7)
    study = optuna.create_study()
    study.enqueue_trial(config_params(cfg, space))
    with pytest.warns(UserWarning, match="out of range"):
        assert suggest(study.ask(), space, BASELINE).num_threads == 7


def test_detect() -> None:
    """What this machine is: compared to the truth, not just to plausible types."""
    import torch

    hw = Hardware.detect()
    assert hw.cpu_count == os.cpu_count()
    assert hw.apex is False  # not installed here (tests/trial/loop/test_knobs.py relies on it too)
    if not torch.cuda.is_available():
        assert (hw.cuda, hw.gpu_count) == (False, 0)
    else:  # pragma: no cover - on a GPU machine
        assert (hw.cuda, hw.gpu_count) == (True, torch.cuda.device_count())


def test_detect_reads_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another machine gives another answer: nothing is assumed."""
    import torch

    import autotune.search.space.machine as space_module

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(96)))
    monkeypatch.setattr(space_module, "CGROUP_CPU_MAX", Path("/nonexistent/cpu.max"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(space_module, "cpu_bf16_native", lambda: True)
    assert Hardware.detect() == Hardware(cuda=True, gpu_count=4, cpu_count=96, apex=False)
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one core, not a crash
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(space_module, "cpu_bf16_native", lambda: False)
    assert Hardware.detect() == Hardware(
        cuda=False, gpu_count=0, cpu_count=1, apex=False, cpu_bf16=False, memory_bytes=space_module.memory_bytes(False)
    )


def test_memory_is_the_smallest_visible_gpus_or_the_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import torch

    from autotune.search.space.machine import memory_bytes
    from tests.fakes import UUID_A, UUID_B, FakeGpu, FakeNvml

    ram = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) * 1024
    assert memory_bytes(False) == ram  # the whole RAM: the same on every run, so the narrowed space is too
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(
        sys.modules, "pynvml", FakeNvml([FakeGpu(UUID_A, memory=80 * 2**30), FakeGpu(UUID_B, memory=40 * 2**30)])
    )
    assert memory_bytes(True) == 40 * 2**30 and not torch.cuda.is_initialized()
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_fails=True))
    assert memory_bytes(True) is None  # no NVML: not sized


def test_apex_without_its_cuda_extension_is_not_available(fake_apex_python_only: Path) -> None:
    from autotune.trial.loop.knobs.optimizer_fusion import apex_available

    assert importlib.util.find_spec("apex.optimizers") is not None  # the Python part is there
    assert apex_available() is False  # but FusedAdam would fail at its first step without amp_C
    assert Hardware.detect().apex is False


def test_apex_with_its_cuda_extension_is_available(fake_apex_python_only: Path) -> None:
    from autotune.trial.loop.knobs.optimizer_fusion import apex_available

    (fake_apex_python_only / "amp_C.py").write_text("")  # stands for the compiled amp_C extension
    importlib.invalidate_caches()
    assert apex_available() is True
    assert Hardware.detect().apex is True


# --- the strategy: parallel and its fsdp sub-knobs ------------------------------------------------------

FSDP_SUBS = ("fsdp_reshard", "fsdp_param_dtype", "fsdp_reduce_dtype", "fsdp_offload")


def test_the_strategy_is_searched_with_several_gpus_and_inert_with_one() -> None:
    space, _ = for_hardware(load_space(DEFAULT), GPU4, stages=2)
    assert space["parallel"] == Choices(("ddp", "fsdp"))
    assert space["fsdp_reduce_dtype"] == Choices(("fp32", "bf16")) and space["fsdp_offload"] == Choices((False, True))
    space, notes = for_hardware(load_space(DEFAULT), CPU, stages=2)  # one process: nothing to shard
    assert space["parallel"] == Fixed("ddp") and all(
        space[k] == Fixed(v) for k, v in zip(FSDP_SUBS, (True, "fp32", "fp32", False))
    )
    assert any(n.startswith("parallel fixed to 'ddp': gpus is 1") for n in notes)


def test_two_cpu_processes_search_fsdp_without_offload(tmp_path: Path) -> None:
    """Two gloo ranks on a CPU (the tests' DDP): the parameters already live in host memory."""
    two = Hardware(cuda=False, gpu_count=2, cpu_count=2, apex=False)
    space, notes = for_hardware(
        load_space(
            write(
                tmp_path,
                "knobs:\n  gpus: 2\n  parallel: [ddp, fsdp]\n"
                "  fsdp_offload: [false, true]\n  fsdp_reduce_dtype: [fp32, bf16]\n",
            )
        ),
        two,
        stages=2,
    )
    assert space["parallel"] == Choices(("ddp", "fsdp")) and space["fsdp_reduce_dtype"] == Choices(("fp32", "bf16"))
    assert space["fsdp_offload"] == Fixed(False) and any("host memory" in n for n in notes)


def test_fsdp_sub_knobs_are_inert_when_parallel_is_ddp(tmp_path: Path) -> None:
    space, notes = for_hardware(
        load_space(write(tmp_path, "knobs:\n  gpus: [1, 2]\n  parallel: ddp\n  fsdp_reshard: [true, false]\n")),
        GPU4,
        stages=2,
    )
    assert space["fsdp_reshard"] == Fixed(True) and any("parallel is not fsdp" in n for n in notes)


def test_fsdp_on_a_pipeline_without_blocks_is_bad_input_or_narrowed(tmp_path: Path) -> None:
    from autotune.pipelines import NO_BLOCKS, unsupported_of
    from tests.fault_pipelines import NoBlocks

    unsupported = unsupported_of(NoBlocks(None))
    assert "parallel" in unsupported
    only = write(tmp_path, "knobs:\n  gpus: 2\n  parallel: fsdp\n")
    with pytest.raises(SearchSpaceError, match=f"knob 'parallel': fsdp: {NO_BLOCKS}") as e:
        for_hardware(load_space(only), GPU4, stages=0, unsupported=unsupported)
    assert "\n" not in str(e.value)
    both = write(tmp_path, "knobs:\n  gpus: 2\n  parallel: [ddp, fsdp]\n  fsdp_offload: [false, true]\n", "both.yaml")
    space, notes = for_hardware(load_space(both), GPU4, stages=0, unsupported=unsupported)
    assert space["parallel"] == Fixed("ddp") and space["fsdp_offload"] == Fixed(False)
    assert any("neither `stages` nor `blocks`" in n for n in notes)


@pytest.mark.parametrize(
    "body, words",
    [
        ("knobs:\n  parallel: [ddp, zero3]\n", "knob 'parallel': parallel must be one of ddp|fsdp, got 'zero3'"),
        ("knobs:\n  fsdp_reduce_dtype: fp16\n", "knob 'fsdp_reduce_dtype': fsdp_reduce_dtype must be one of fp32|bf16"),
        ("knobs:\n  fsdp_offload: [no_such]\n", "knob 'fsdp_offload'"),
    ],
)
def test_a_bad_strategy_in_the_space_file_is_one_line(tmp_path: Path, body: str, words: str) -> None:
    with pytest.raises(SearchSpaceError, match=words) as e:
        load_space(write(tmp_path, body))
    assert "\n" not in str(e.value)


def test_suggest_asks_for_the_strategy_only_where_it_can_matter() -> None:
    space = SearchSpace(
        {
            "gpus": Choices((1, 2)),
            "parallel": Choices(("ddp", "fsdp")),
            "fsdp_reshard": Choices((True, False)),
            "fsdp_reduce_dtype": Choices(("fp32", "bf16")),
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen: dict[tuple[int, str], set[str]] = {}
    for _ in range(40):
        t = study.ask()
        cfg = suggest(t, space, TrialConfig())
        seen.setdefault((cfg.gpus, cfg.parallel), set()).update(t.params)
        if cfg.gpus == 1 or cfg.parallel == "ddp":
            assert (cfg.fsdp_reshard, cfg.fsdp_reduce_dtype) == (True, "fp32")  # inert
        study.tell(t, 1.0)
    assert seen[(1, "ddp")] == {"gpus"}
    assert seen[(2, "ddp")] == {"gpus", "parallel"}
    assert seen[(2, "fsdp")] == {"gpus", "parallel", "fsdp_reshard", "fsdp_reduce_dtype"}


def test_an_enqueued_fsdp_config_comes_back_exactly() -> None:
    space = SearchSpace(
        {"gpus": Choices((1, 2)), "parallel": Choices(("ddp", "fsdp")), "fsdp_reshard": Choices((True, False))}
    )
    cfg = TrialConfig(gpus=2, parallel="fsdp", fsdp_reshard=False)
    assert config_params(cfg, space) == {"gpus": 2, "parallel": "fsdp", "fsdp_reshard": False}
    assert config_params(TrialConfig(gpus=1), space) == {"gpus": 1}  # the strategy is not a param of one process
    study = optuna.create_study()
    study.enqueue_trial(config_params(cfg, space))
    assert suggest(study.ask(), space, TrialConfig()) == cfg
