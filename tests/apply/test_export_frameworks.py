"""Each framework export, trained for a few steps under the real library on CPU, every knob read back live.

The renderings are executed as written (the Lightning and HF Python, accelerate's YAML through
`accelerate launch` and its script part), on tiny models built here: nothing is downloaded. The
framework packages are in the `test` extra, so a missing one fails here rather than skips. What only a
GPU shows (fp16, fused CUDA AdamW, pinned memory in effect) is checked as the objects that would carry
it: the plugin, the optimizer's flags, the loader's fields. The fp16/compile/apex/multi-GPU renderings
are checked as text in test_export.py.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import transformers
import yaml
from torch import nn

from autotune.apply.export import render, to_accelerate, to_hf, to_lightning
from autotune.core.config import TrialConfig
from autotune.core.configfile import Export
from tests.docs_pages import DOCS, python_block

# Every knob a CPU can carry away from the frameworks' defaults: bf16, accumulation 2 (global batch 8 of
# micro-batches of 4), one loader worker with its own prefetch, fused AdamW, kept (zeroed) gradients.
LIVE = TrialConfig(
    num_workers=1,
    pin_memory=True,
    batch_size=4,
    precision="bf16",
    optimizer_fusion="fused",
    gpus=1,
    channels_last=True,
    cudnn_benchmark=True,
    persistent_workers=True,
    prefetch_factor=3,
    set_to_none=False,
    num_threads=1,
    lr=3e-3,
    global_batch=8,
)
STEPS = 3  # optimizer steps each export trains


def _cpu_export(cfg: TrialConfig) -> Export:
    return Export(config=cfg, environment={"device": "cpu"})  # what `autotune export` reads of a CPU study


@pytest.fixture(autouse=True)
def _restore_process_state(monkeypatch: pytest.MonkeyPatch):
    """The renderings set process-wide torch state (cudnn.benchmark, threads), and a DDP run its process
    group and MASTER_* variables: later tests must not see them."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    threads, env = torch.get_num_threads(), dict(os.environ)
    yield
    torch.set_num_threads(threads)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)


def _images(n: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    images, masks = torch.randn(n, 3, 16, 16, generator=g), torch.randn(n, 4, 16, 16, generator=g)
    return torch.utils.data.TensorDataset(images, masks)


LOADER_FIELDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def _loader_fields(loader: Any) -> dict[str, Any]:
    """A loader accelerate prepared batches through its batch_sampler (its own batch_size is None)."""
    per_process = loader.batch_size if loader.batch_size is not None else loader.batch_sampler.batch_size
    return {"batch_size": per_process, **{k: getattr(loader, k) for k in LOADER_FIELDS}}


def _expected_loader(cfg: TrialConfig) -> dict[str, Any]:
    return {"batch_size": cfg.batch_size, **{k: getattr(cfg, k) for k in LOADER_FIELDS}}  # the knobs' own names


def _grad_state(params: Any) -> str:
    grads = [p.grad for p in params]
    return "none" if any(g is None for g in grads) else "zero" if not any(g.any() for g in grads) else "acc"


# ----------------------------------------------------------------------------------------- Lightning


def _lightning_module(hooks: type) -> pl.LightningModule:
    class Tiny(hooks, pl.LightningModule):  # type: ignore[misc, valid-type]
        """The user's module, the export's hooks mixed in as its docstring says."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.seen: dict[str, list[Any]] = {"grads": [], "inputs_cl": []}

        def on_train_start(self) -> None:
            self.seen["wrapped"] = type(self.trainer.strategy.model).__name__

        def configure_model(self) -> None:
            # Lightning runs this after setup() and before the strategy moves and wraps (DDP) the model.
            self.seen["cl_before_strategy"] = self.conv.weight.is_contiguous(memory_format=torch.channels_last)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            self.seen["inputs_cl"].append(x.is_contiguous(memory_format=torch.channels_last))
            return nn.functional.mse_loss(self.conv(x).float(), y)

        def on_before_backward(self, loss: torch.Tensor) -> None:
            self.seen["grads"].append(_grad_state(self.parameters()))  # after the export's zero_grad

    return Tiny()


def test_lightning_export_trains_with_every_knob(tmp_path: Path) -> None:
    ns: dict[str, Any] = {}
    exec(compile(to_lightning(LIVE, device="cpu"), "lightning_export.py", "exec"), ns)
    assert torch.get_num_threads() == LIVE.num_threads
    model = _lightning_module(ns["AutotuneHooks"])
    # One process of what gpus=2 runs: DDP (over gloo here), where a late channels_last costs a copy per step.
    trainer_kwargs = {**ns["trainer_kwargs"], "strategy": "ddp"}
    trainer = pl.Trainer(
        **trainer_kwargs,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    assert torch.backends.cudnn.benchmark is True
    loader = torch.utils.data.DataLoader(_images(8 * STEPS), shuffle=True, **ns["dataloader_kwargs"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, loader)

    assert trainer.global_step == STEPS
    assert isinstance(trainer.accelerator, pl.accelerators.CPUAccelerator) and trainer.num_devices == 1
    plugin = trainer.precision_plugin
    assert isinstance(plugin, pl.plugins.precision.MixedPrecision) and plugin.precision == "bf16-mixed"
    assert trainer.accumulate_grad_batches == LIVE.grad_accum == 2
    assert _loader_fields(trainer.train_dataloader) == _expected_loader(LIVE)
    (opt,) = trainer.optimizers
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
    (group,) = opt.param_groups
    assert group["weight_decay"] == 0.01 and group["lr"] == LIVE.effective_lr  # constant: no scheduler
    assert trainer.lr_scheduler_configs == []
    assert model.seen["wrapped"] == "DistributedDataParallel" and model.seen["cl_before_strategy"] is True
    # DDP built its gradient buckets from channels_last weights: no "Grad strides do not match bucket view
    # strides" (which the old on_fit_start conversion raised at the first backward).
    assert not [w for w in caught if "strides" in str(w.message)]
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert all(model.seen["inputs_cl"])
    # Two micro-batches per step; each step's first finds the last step's gradients zeroed, not freed.
    assert model.seen["grads"] == ["none", "acc", "zero", "acc", "zero", "acc"]


# ------------------------------------------------------------------------------------ Hugging Face


class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8 * STEPS

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(i, i + 8) % 32
        return {"input_ids": ids, "labels": ids}


class _Loaders(transformers.TrainerCallback):
    """Keeps the DataLoader the Trainer trains from (the one accelerate prepared)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kw: Any) -> None:
        self.loader = train_dataloader


def test_hf_export_trains_with_every_knob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = LIVE.replace(pin_memory=False, checkpoint_segments=1)  # HF pins by default: show it turned off
    ns: dict[str, Any] = {}
    exec(compile(to_hf(cfg, device="cpu"), "hf_export.py", "exec"), ns)
    assert torch.backends.cudnn.benchmark is True and torch.get_num_threads() == cfg.num_threads
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        **ns["training_args"],
        max_steps=STEPS,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
        )
    )
    loaders = _Loaders()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[loaders])
    trainer.train()

    assert trainer.state.global_step == STEPS and args.device.type == "cpu"
    assert trainer.accelerator.mixed_precision == "bf16"
    # The Trainer accumulates itself: the 6 micro-batches of one epoch made the 3 steps.
    assert trainer.args.gradient_accumulation_steps == cfg.grad_accum == 2 and trainer.state.epoch == 1.0
    assert _loader_fields(loaders.loader) == _expected_loader(cfg)
    opt = trainer.optimizer.optimizer  # inside accelerate's AcceleratedOptimizer
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
    decays = sorted({g["weight_decay"] for g in opt.param_groups})
    assert decays == [0.0, 0.01]  # HF exempts biases and LayerNorm weights (the export says so)
    assert all(g["lr"] == cfg.effective_lr for g in opt.param_groups)  # constant, after 3 steps
    assert trainer.lr_scheduler.get_last_lr() == [cfg.effective_lr] * len(opt.param_groups)
    assert model.is_gradient_checkpointing


# -------------------------------------------------------------------------------------- accelerate

_SCRIPT = """\
import json, sys
import torch
from torch import nn

torch.manual_seed(0)
dataset = torch.utils.data.TensorDataset(torch.randn({n}, 3, 16, 16), torch.randn({n}, 4, 16, 16))
model = nn.Conv2d(3, 4, 3, padding=1)
inputs_cl = []

def loss_fn(model, batch):
    x, y = batch
    x = x.contiguous(memory_format=torch.channels_last)
    inputs_cl.append(x.is_contiguous(memory_format=torch.channels_last))
    return nn.functional.mse_loss(model(x).float(), y)

{export}
opt = optimizer.optimizer
weight = accelerator.unwrap_model(model).weight
json.dump({{
    "mixed_precision": accelerator.mixed_precision, "device": accelerator.device.type,
    "distributed_type": str(accelerator.distributed_type), "num_processes": accelerator.num_processes,
    "accumulation": accelerator.gradient_accumulation_steps,
    "loader": {{"batch_size": loader.batch_sampler.batch_size, **{{k: getattr(loader, k) for k in {fields!r}}}}},
    "optimizer": type(opt).__name__, "fused": opt.defaults["fused"],
    "weight_decay": [g["weight_decay"] for g in opt.param_groups], "lr": [g["lr"] for g in opt.param_groups],
    "steps": int(opt.state[weight]["step"]), "channels_last": weight.is_contiguous(memory_format=torch.channels_last),
    "inputs_cl": all(inputs_cl), "grads": "none" if weight.grad is None else "zero" if not weight.grad.any() else "acc",
    "cudnn_benchmark": torch.backends.cudnn.benchmark, "threads": torch.get_num_threads(),
}}, open(sys.argv[1], "w"))
"""


def _script_part(rendered: str) -> str:
    """accelerate's rendering carries the script's part as `#   ` comments after its heading line."""
    lines = rendered.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# In train.py")) + 1
    return "\n".join(line[4:] for line in lines[start:] if line.startswith("#   "))


def test_accelerate_export_trains_with_every_knob(tmp_path: Path) -> None:
    rendered = to_accelerate(LIVE, device="cpu")
    (tmp_path / "accelerate.yaml").write_text(rendered)
    script = _SCRIPT.format(n=8 * STEPS, export=_script_part(rendered), fields=LOADER_FIELDS)
    (tmp_path / "train.py").write_text(script)
    out = tmp_path / "knobs.json"
    # `accelerate launch`, without the CLI's import of every other subcommand (6 s of start-up here).
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "accelerate.yaml")]
    run = subprocess.run(
        [*launch, str(tmp_path / "train.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert yaml.safe_load(rendered)["mixed_precision"] == got["mixed_precision"] == "bf16"
    assert got["device"] == "cpu" and got["num_processes"] == 1 and got["distributed_type"] == "DistributedType.NO"
    assert got["accumulation"] == LIVE.grad_accum == 2 and got["steps"] == STEPS
    assert got["loader"] == _expected_loader(LIVE)
    assert got["optimizer"] == "AdamW" and got["fused"] is True
    assert got["weight_decay"] == [0.01] and got["lr"] == [LIVE.effective_lr]
    assert got["channels_last"] is True and got["inputs_cl"] is True
    assert got["grads"] == "zero"  # set_to_none=False: the last zero_grad kept them
    assert got["cudnn_benchmark"] is True and got["threads"] == LIVE.num_threads


# ------------------------------------------------------------------------------------ the docs' examples

APPLY_PAGE = DOCS / "apply.md"  # "Exports for Lightning, transformers and accelerate"


@pytest.mark.parametrize(
    "fmt, module, script",
    [
        ("lightning", "autotune_lightning", "train_lightning.py"),
        ("hf", "autotune_hf", "train_hf.py"),
    ],
)
def test_docs_examples_train_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, module: str, script: str
) -> None:
    """The export written where the page's `autotune export -o` puts it, then the page's script run."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # the scripts' logs, checkpoints and out/ land here
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    (tmp_path / f"{module}.py").write_text(render(fmt, _cpu_export(LIVE)))
    (tmp_path / script).write_text(python_block(APPLY_PAGE, f"# {script}"))
    try:
        ran = runpy.run_path(str(tmp_path / script), run_name="__main__")
    finally:
        sys.modules.pop(module, None)
    steps = 64 // (LIVE.batch_size * LIVE.grad_accum)  # one epoch of the example's 64 samples
    trainer = ran["trainer"]
    assert (trainer.global_step if fmt == "lightning" else trainer.state.global_step) == steps


# ------------------------------------------------------------------------------------ the fsdp strategy

FSDP = TrialConfig(
    gpus=2, batch_size=4, parallel="fsdp", fsdp_reshard=False, fsdp_reduce_dtype="bf16", fsdp_offload=True
)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def test_hf_export_hands_fsdp2_to_the_trainer(tmp_path: Path) -> None:
    ns: dict[str, Any] = {}
    exec(to_hf(FSDP, device="cpu"), ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = transformers.TrainingArguments(output_dir=str(tmp_path), **ns["training_args"])
    # What TrainingArguments hands accelerate's FSDP plugin.
    assert args.fsdp_plugin_args["fsdp_version"] == 2
    assert args.fsdp_plugin_args["reshard_after_forward"] is False and args.fsdp_plugin_args["cpu_offload"] is True


def test_lightning_export_shards_the_model_as_the_trials_did() -> None:
    """Lightning's FSDP2 strategy, built by the Trainer; its configure_model run on a one-rank gloo group.
    Without offload: CPUOffloadPolicy() pins host memory, which needs CUDA (a CPU search never offloads)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    ns: dict[str, Any] = {}
    exec(to_lightning(FSDP.replace(fsdp_offload=False), device="cpu"), ns)
    trainer = pl.Trainer(**ns["trainer_kwargs"], logger=False, enable_checkpointing=False)
    assert type(trainer.strategy).__name__ == "ModelParallelStrategy" and trainer.num_devices == 2

    class Module(ns["AutotuneHooks"], nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([_Block(), _Block()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    m = Module()
    m.configure_model()
    assert isinstance(m, FSDPModule) and all(isinstance(b, FSDPModule) for b in m.blocks)
    m(torch.randn(2, 8)).sum().backward()
    # reshard_after_forward=False: the blocks kept their gathered parameters through forward; sharded again after backward
    weight = m.blocks[0].lin.weight
    assert isinstance(weight, DTensor) and weight.grad is not None


def test_accelerate_export_configures_its_fsdp2_plugin(tmp_path: Path) -> None:
    """`accelerate launch` with the rendered YAML: the plugin reads fsdp_version 2, the resharding and the
    offload from it, and the script's part gives it the mixed-precision policy. accelerate runs FSDP only
    on an accelerator (on CPU it starts the processes undistributed), so the sharding itself is checked
    by scripts/gpu_check.sh, not here."""
    rendered = to_accelerate(FSDP, device="cpu")
    (tmp_path / "accelerate.yaml").write_text(rendered)
    lines = _script_part(rendered).splitlines()
    setup = "\n".join(
        line for line in lines if line.startswith(("import", "from", "plugin", "    fsdp_version", "accelerator"))
    )
    (tmp_path / "train.py").write_text(setup + "\n" + _FSDP_REPORT)
    out = tmp_path / "plugin.json"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "accelerate.yaml")]
    run = subprocess.run(
        [*launch, str(tmp_path / "train.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert yaml.safe_load(rendered)["distributed_type"] == "FSDP"
    assert got == {
        "version": 2,
        "reshard": False,
        "offload": "CPUOffloadPolicy",
        "param_dtype": "torch.float32",
        "reduce_dtype": "torch.bfloat16",
    }


_FSDP_REPORT = """
import json, sys
p = plugin
json.dump({"version": p.fsdp_version, "reshard": p.reshard_after_forward, "offload": type(p.cpu_offload).__name__,
           "param_dtype": str(p.mixed_precision_policy.param_dtype),
           "reduce_dtype": str(p.mixed_precision_policy.reduce_dtype)}, open(sys.argv[1], "w"))
"""


def test_channels_last_under_fsdp_converts_the_inputs_not_the_sharded_weights() -> None:
    """fully_shard refuses non-contiguous parameters: the exports under FSDP lay out the 4-D inputs only."""
    from autotune.apply.export.accelerate import to_accelerate

    sharded = FSDP.replace(channels_last=True)
    lightning = to_lightning(sharded, device="cpu")
    assert "self.to(memory_format=torch.channels_last)" not in lightning
    assert "def on_after_batch_transfer" in lightning and "under FSDP the inputs only" in lightning
    assert "self.to(memory_format=torch.channels_last)" in to_lightning(sharded.replace(parallel="ddp"), device="cpu")
    accelerate = to_accelerate(sharded)
    assert "model.to(memory_format=torch.channels_last)" not in accelerate and "4-D inputs only" in accelerate
