"""Python for lightning.pytorch: Trainer kwargs, DataLoader kwargs, and hooks for the rest."""

from __future__ import annotations

from autotune.apply.export import _strategy
from autotune.apply.export._common import (
    accelerator,
    knob_table,
    loader_kwargs,
    optimizer_expr,
    training_lines,
    zero_grad_call,
)
from autotune.core.config import TrialConfig

_LIGHTNING_PRECISION = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def to_lightning(cfg: TrialConfig, *, device: str | None = None) -> str:
    """Python for lightning.pytorch: Trainer kwargs, DataLoader kwargs, and the hooks for the rest."""
    multi = cfg.gpus > 1
    where = {
        "num_workers": "dataloader_kwargs['num_workers']",
        "pin_memory": "dataloader_kwargs['pin_memory']",
        "batch_size": "dataloader_kwargs['batch_size'] (per process)",
        "precision": f"trainer_kwargs['precision'] = {_LIGHTNING_PRECISION[cfg.precision]!r}",
        "optimizer_fusion": "AutotuneHooks.configure_optimizers",
        "checkpoint_segments": "no Trainer flag: wrap the first k blocks yourself (see below)",
        "gpus": "trainer_kwargs['devices']" + (" + strategy='ddp'" if multi else ""),
        "channels_last": "no Trainer flag: AutotuneHooks converts model and batches"
        if cfg.channels_last
        else "no Trainer flag; off, nothing to do",
        "cudnn_benchmark": "trainer_kwargs['benchmark'] (sets torch.backends.cudnn.benchmark)",
        "compile": "no Trainer flag: torch.compile(model) before trainer.fit (see below)",
        "persistent_workers": "dataloader_kwargs['persistent_workers']",
        "prefetch_factor": "dataloader_kwargs['prefetch_factor']",
        "set_to_none": "AutotuneHooks.optimizer_zero_grad",
        "num_threads": "torch.set_num_threads (see below)"
        if cfg.num_threads
        else "0 = torch's default; nothing to set",
    }
    trainer = [
        f"    accelerator={accelerator(device)!r},",
        f"    devices={cfg.gpus!r},",
    ]
    trainer += _strategy.lightning_strategy(cfg)
    trainer += [
        f"    precision={_LIGHTNING_PRECISION[cfg.precision]!r},",
        f"    benchmark={cfg.cudnn_benchmark!r},  # cudnn_benchmark",
        f"    accumulate_grad_batches={cfg.grad_accum!r},  # global batch {cfg.global_batch_size}",
    ]
    hooks = [
        "class AutotuneHooks:",
        '    """Mix into your module: class MyModule(AutotuneHooks, lightning.pytorch.LightningModule).',
        "    A hook your module defines itself shadows the one here: call this one from it with super().",
        '    """',
        "",
        "    def configure_optimizers(self):",
        f"        # optimizer_fusion={cfg.optimizer_fusion}; lr for global batch {cfg.global_batch_size} "
        f"({cfg.lr_scaling} rule if it was scaled)",
        f"        return {optimizer_expr(cfg, 'self.parameters()')}",
        "",
        "    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):",
        f"        {zero_grad_call(cfg)}  # set_to_none={cfg.set_to_none!r}",
    ]
    hooks += _strategy.lightning_hook(cfg)
    if cfg.channels_last and not _fsdp(cfg):
        hooks += [
            "",
            "    def setup(self, stage):",
            "        # channels_last: the weights, before the strategy moves the model and wraps it in DDP",
            "        # (on_fit_start is too late: DDP's gradient buckets would keep the old strides)",
            "        super().setup(stage)",
            "        self.to(memory_format=torch.channels_last)",
        ]
    if cfg.channels_last:
        hooks += [
            "",
            "    def on_after_batch_transfer(self, batch, dataloader_idx):",
            "        # channels_last: the 4-D inputs (images); other tensors pass through"
            + ("; under FSDP the inputs only (fully_shard refuses channels_last weights)" if _fsdp(cfg) else ""),
            "        def cl(x):",
            "            return x.contiguous(memory_format=torch.channels_last) "
            "if torch.is_tensor(x) and x.dim() == 4 else x",
            "        return [cl(x) for x in batch] if isinstance(batch, (list, tuple)) else cl(batch)",
        ]
    extra = []
    if cfg.num_threads:
        extra.append(f"torch.set_num_threads({cfg.num_threads!r})  # num_threads, before building the DataLoader")
    extra.append(
        f"# compile={cfg.compile}: "
        + (
            "no change"
            if cfg.compile == "off"
            else f"model = torch.compile(model, mode={cfg.compile!r}) before trainer.fit(model)"
        )
    )
    extra.append(
        f"# checkpoint_segments={cfg.checkpoint_segments}: "
        + (
            "off"
            if cfg.checkpoint_segments == 0
            else f"in forward(), run the first {cfg.checkpoint_segments} encoder stages through "
            "torch.utils.checkpoint.checkpoint(stage, x, use_reentrant=False)"
        )
    )
    parts = [
        "# Lightning (lightning.pytorch) settings for the configuration autotune measured.",
        "# Every tuned knob, and where it goes:",
        knob_table(cfg, where | _strategy.lightning_rows(cfg)),
        *training_lines(cfg),
        "import torch",
        *(["from lightning.pytorch.strategies import ModelParallelStrategy"] if _strategy.fsdp_on(cfg) else []),
        *(
            ["import apex.optimizers  # optimizer_fusion=apex needs NVIDIA apex"]
            if cfg.optimizer_fusion == "apex"
            else []
        ),
        "",
        "trainer_kwargs = dict(",
        *trainer,
        ")",
        "",
        "dataloader_kwargs = dict(",
        *loader_kwargs(cfg),
        ")",
        "",
        *hooks,
        "",
        *extra,
        "",
        "# trainer = lightning.pytorch.Trainer(**trainer_kwargs)",
        "# trainer.fit(model, torch.utils.data.DataLoader(dataset, shuffle=True, **dataloader_kwargs))",
    ]
    return "\n".join(parts) + "\n"


def _fsdp(cfg: TrialConfig) -> bool:
    """Weights sharded by fully_shard, which refuses non-contiguous (channels_last) parameters."""
    return cfg.parallel == "fsdp" and cfg.gpus > 1
