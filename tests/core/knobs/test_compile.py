"""core/knobs/compile.py: reduce-overhead (CUDA graphs) is one of compile's modes: searched on CUDA, written
by every export as the mode, applied by the trial."""

from __future__ import annotations

from autotune.apply.export import _compute
from autotune.core.config import TrialConfig
from autotune.core.knobs import compile
from autotune.search.space.machine import Hardware
from autotune.search.space.reading import load_space
from autotune.search.space.resolve import for_hardware
from autotune.search.space.spec import DEFAULT_SPACE, Fixed


def test_reduce_overhead_is_searched_on_cuda_and_compile_is_off_without_it() -> None:
    gpu, _ = for_hardware(load_space(DEFAULT_SPACE), Hardware(cuda=True, gpu_count=1, cpu_count=8, apex=False))
    assert "reduce-overhead" in gpu["compile"].values
    cpu, _ = for_hardware(load_space(DEFAULT_SPACE), Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False))
    assert cpu["compile"] == Fixed("off")


def test_every_export_writes_the_mode() -> None:
    cfg = TrialConfig(compile="reduce-overhead")
    assert compile.at_model("net", cfg) == "torch.compile(net, mode='reduce-overhead')"
    assert compile.LINES[0].format(m="net", **compile.line_fields(cfg, {}, "cuda")) == (
        "net.forward = torch.compile(net.forward, mode='reduce-overhead')  # autotune: compile, its forward in place"
    )
    assert "    torch_compile_mode='reduce-overhead'," in _compute.hf_args(cfg)
    assert _compute.accelerate_conf(cfg)["dynamo_config"]["dynamo_mode"] == "reduce-overhead"
    assert "mode='reduce-overhead'" in _compute.lightning_extra(cfg)[-1]
