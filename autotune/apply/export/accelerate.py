"""An `accelerate launch --config_file` YAML, with comments for the knobs accelerate does not hold."""

from __future__ import annotations

from typing import Any

import yaml

from autotune.apply.export import _compute, _loader, _step
from autotune.apply.export._table import knob_table
from autotune.core.config import TrialConfig
from autotune.core.knobs import gpus, strategy


def to_accelerate(cfg: TrialConfig, *, device: str | None = None) -> str:
    """An `accelerate launch --config_file` YAML, with comments for the knobs accelerate does not hold."""
    on_cpu = device is not None and device.startswith("cpu")
    conf: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": 1,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": on_cpu,
        # distributed_type: safe_dump quotes 'NO', which YAML 1.1 would read as false
        **gpus.accelerate_layout(cfg, on_cpu),
        **_compute.accelerate_conf(cfg),
    }
    header = [
        "# accelerate config for the configuration autotune measured.",
        "# Use: accelerate launch --config_file accelerate.yaml train.py",
        "# accelerate holds the process layout, mixed precision and torch.compile; the DataLoader and",
        "# optimizer knobs stay in your script. Every tuned knob, and where it goes:",
        knob_table(cfg, "accelerate"),
        *_step.training_lines(cfg),
        *script_lines(cfg),
        "",
    ]
    return "\n".join(header) + yaml.safe_dump(conf, sort_keys=True, default_flow_style=False)


def script_lines(cfg: TrialConfig) -> list[str]:
    """The training script's part, as comments: Python that runs as written once `#   ` is stripped, given
    your `model`, `dataset` and `loss_fn(model, batch)`."""
    code = [
        "import torch",
        "from accelerate import Accelerator",
        *_step.imports(cfg),
        *_compute.accelerate_code(cfg),
        *strategy.accelerate_plugin(cfg),
        "loader = torch.utils.data.DataLoader(",
        "    dataset, shuffle=True,",
        *_loader.kwargs(cfg),
        ")",
        f"optimizer = {_step.optimizer_expr(cfg, 'model.parameters()')}",
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)",
        "for batch in loader:",
        f"    with accelerator.accumulate(model):  # steps the optimizer every {cfg.grad_accum} batch(es)",
        "        accelerator.backward(loss_fn(model, batch))",
        "        optimizer.step()",
        f"        {_step.zero_grad_call(cfg)}",
    ]
    return [
        "# In train.py, what accelerate does not hold (the constant lr: no scheduler):",
        *(f"#   {line}" for line in code),
    ]
