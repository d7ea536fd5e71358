"""An `accelerate launch --config_file` YAML, with comments for the knobs accelerate does not hold."""

from __future__ import annotations

from typing import Any

import yaml

from autotune.apply.export import _strategy
from autotune.apply.export._common import knob_table, loader_kwargs, optimizer_expr, training_lines, zero_grad_call
from autotune.core.config import TrialConfig

_ACC_PRECISION = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}


def to_accelerate(cfg: TrialConfig, *, device: str | None = None) -> str:
    """An `accelerate launch --config_file` YAML, with comments for the knobs accelerate does not hold."""
    on_cpu = device is not None and device.startswith("cpu")
    n = cfg.gpus
    dist = "FSDP" if _strategy.fsdp_on(cfg) else ("MULTI_CPU" if on_cpu else "MULTI_GPU") if n > 1 else "NO"
    conf: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": dist,  # safe_dump quotes 'NO', which YAML 1.1 would read as false
        "downcast_bf16": "no",
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": _ACC_PRECISION[cfg.precision],
        "num_machines": 1,
        "num_processes": n,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": on_cpu,
        **({"fsdp_config": _strategy.accelerate_config(cfg)} if _strategy.fsdp_on(cfg) else {}),
    }
    if cfg.compile != "off":
        conf["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": cfg.compile,
            "dynamo_use_dynamic": False,
            "dynamo_use_fullgraph": False,
        }
    in_script = "not an accelerate setting: in train.py (below)"
    where = {
        "num_workers": f"{in_script}, DataLoader(num_workers=...)",
        "pin_memory": f"{in_script}, DataLoader(pin_memory=...)",
        "batch_size": f"{in_script}, DataLoader(batch_size=...) per process",
        "precision": f"mixed_precision: {_ACC_PRECISION[cfg.precision]}",
        "optimizer_fusion": f"{in_script}, {optimizer_expr(cfg, 'model.parameters()')}",
        "checkpoint_segments": f"{in_script}, torch.utils.checkpoint on the first k blocks"
        if cfg.checkpoint_segments
        else "off, nothing to do",
        "gpus": f"num_processes: {n}, distributed_type: {dist}",
        "channels_last": (
            f"{in_script}, 4-D inputs only (FSDP shards contiguous weights only)"
            if cfg.parallel == "fsdp" and cfg.gpus > 1
            else f"{in_script}, model.to(memory_format=torch.channels_last) + 4-D inputs"
        )
        if cfg.channels_last
        else "off, nothing to do",
        "cudnn_benchmark": f"{in_script}, torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark}",
        "compile": "dynamo_config (backend INDUCTOR, dynamo_mode)" if cfg.compile != "off" else "off: no dynamo_config",
        "persistent_workers": f"{in_script}, DataLoader(persistent_workers=...)",
        "prefetch_factor": f"{in_script}, DataLoader(prefetch_factor=...)",
        "set_to_none": f"{in_script}, {zero_grad_call(cfg)}",
        "num_threads": f"{in_script}, torch.set_num_threads({cfg.num_threads})"
        if cfg.num_threads
        else "0 = torch's default; nothing to set",
    }
    header = [
        "# accelerate config for the configuration autotune measured.",
        "# Use: accelerate launch --config_file accelerate.yaml train.py",
        "# accelerate holds the process layout, mixed precision and torch.compile; the DataLoader and",
        "# optimizer knobs stay in your script. Every tuned knob, and where it goes:",
        knob_table(cfg, where | _strategy.accelerate_rows(cfg, in_script)),
        *training_lines(cfg),
        *script_lines(cfg),
        "",
    ]
    return "\n".join(header) + yaml.safe_dump(conf, sort_keys=True, default_flow_style=False)


def script_lines(cfg: TrialConfig) -> list[str]:
    """The training script's part, as comments: Python that runs as written once `#   ` is stripped, given
    your `model`, `dataset` and `loss_fn(model, batch)`."""
    code = ["import torch", "from accelerate import Accelerator"]
    if cfg.optimizer_fusion == "apex":
        code.append("import apex.optimizers  # optimizer_fusion=apex needs NVIDIA apex")
    code.append(f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark!r}")
    if cfg.num_threads:
        code.append(f"torch.set_num_threads({cfg.num_threads!r})")
    code += _strategy.accelerate_plugin(cfg, cfg.grad_accum)
    if cfg.channels_last and cfg.parallel == "fsdp" and cfg.gpus > 1:
        code.append(
            "# channels_last under FSDP: 4-D inputs only, in the loop (fully_shard refuses channels_last weights)"
        )
    elif cfg.channels_last:
        code.append("model = model.to(memory_format=torch.channels_last)  # and 4-D inputs likewise, in the loop")
    if cfg.checkpoint_segments:
        code.append(
            f"# checkpoint_segments={cfg.checkpoint_segments}: run the first {cfg.checkpoint_segments} "
            "blocks of forward() through torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"
        )
    code += [
        "loader = torch.utils.data.DataLoader(",
        "    dataset, shuffle=True,",
        *loader_kwargs(cfg),
        ")",
        f"optimizer = {optimizer_expr(cfg, 'model.parameters()')}",
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)",
        "for batch in loader:",
        f"    with accelerator.accumulate(model):  # steps the optimizer every {cfg.grad_accum} batch(es)",
        "        accelerator.backward(loss_fn(model, batch))",
        "        optimizer.step()",
        f"        {zero_grad_call(cfg)}",
    ]
    return [
        "# In train.py, what accelerate does not hold (the constant lr: no scheduler):",
        *(f"#   {line}" for line in code),
    ]
