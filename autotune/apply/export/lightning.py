"""Python for lightning.pytorch: Trainer kwargs, DataLoader kwargs, and hooks for the rest."""

from __future__ import annotations

from autotune.apply.export import _compute, _loader, _step
from autotune.apply.export._common import accelerator
from autotune.apply.export._table import knob_table
from autotune.core.config import TrialConfig
from autotune.core.knobs import strategy


def to_lightning(cfg: TrialConfig, *, device: str | None = None) -> str:
    """Python for lightning.pytorch: Trainer kwargs, DataLoader kwargs, and the hooks for the rest."""
    trainer = [
        f"    accelerator={accelerator(device)!r},",
        *_compute.lightning_trainer(cfg),
        f"    accumulate_grad_batches={cfg.grad_accum!r},  # global batch {cfg.global_batch_size}",
    ]
    hooks = [
        "class AutotuneHooks:",
        '    """Mix into your module: class MyModule(AutotuneHooks, lightning.pytorch.LightningModule).',
        "    A hook your module defines itself shadows the one here: call this one from it with super().",
        '    """',
        "",
        *_step.lightning_hooks(cfg),
        *strategy.lightning_hook(cfg),
        *_compute.lightning_hooks(cfg),
    ]
    parts = [
        "# Lightning (lightning.pytorch) settings for the configuration autotune measured.",
        "# Every tuned knob, and where it goes:",
        knob_table(cfg, "lightning"),
        *_step.training_lines(cfg),
        "import torch",
        *(["from lightning.pytorch.strategies import ModelParallelStrategy"] if cfg.sharded else []),
        *_step.imports(cfg),
        "",
        "trainer_kwargs = dict(",
        *trainer,
        ")",
        "",
        "dataloader_kwargs = dict(",
        *_loader.kwargs(cfg),
        ")",
        "",
        *hooks,
        "",
        *_compute.lightning_extra(cfg),
        "",
        "# trainer = lightning.pytorch.Trainer(**trainer_kwargs)",
        "# trainer.fit(model, torch.utils.data.DataLoader(dataset, shuffle=True, **dataloader_kwargs))",
    ]
    return "\n".join(parts) + "\n"
