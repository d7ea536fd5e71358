"""Best trial -> a file a user can apply: autotune's own YAML, or Lightning / HF / accelerate settings.

The native YAML is the round-trippable record (`load_config` reads it back into a TrialConfig). The
framework renderings are one-way: each lists every tuned knob, either as a field the framework has or
as a comment saying where it goes, so nothing the search found is dropped silently.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl, urlencode

import yaml

from autotune.config import KNOBS, TrialConfig, TrialResult
from autotune.errors import ConfigError

FORMATS = ("yaml", "lightning", "hf", "accelerate")

# The headline figures, in the order a reader wants them; any other metric follows these.
METRIC_KEYS = ("samples_per_s", "step_time_p50", "peak_memory_bytes", "data_wait_fraction")

DEFAULT_REPRODUCE = "autotune trial --config best.yaml"


@dataclass(frozen=True)
class Export:
    """Everything an exported file says about one configuration. Built once, rendered many ways."""

    config: TrialConfig
    metrics: dict[str, Any] = field(default_factory=dict)
    baseline_samples_per_s: float | None = None
    speedup: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    # name, trial number, storage. The caller masks the storage URL; to_yaml masks it again because
    # a leaked password in a file people share is worse than masking twice.
    study: dict[str, Any] = field(default_factory=dict)
    reproduce: str = DEFAULT_REPRODUCE

    @classmethod
    def from_result(
        cls,
        config: TrialConfig,
        result: TrialResult,
        *,
        baseline_samples_per_s: float | None = None,
        environment: Mapping[str, Any] | None = None,
        study: Mapping[str, Any] | None = None,
        reproduce: str = DEFAULT_REPRODUCE,
    ) -> Export:
        """Build from a measured TrialResult; the speedup is only stated when both figures are real."""
        metrics = {k: getattr(result, k) for k in METRIC_KEYS}
        sps = result.samples_per_s
        speedup = None
        if _positive(sps) and _positive(baseline_samples_per_s):
            speedup = float(sps) / float(baseline_samples_per_s)  # type: ignore[arg-type]
        env = {"device": result.device, "world_size": result.world_size, **dict(environment or {})}
        return cls(config, metrics, baseline_samples_per_s, speedup, env, dict(study or {}), reproduce)


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


# --------------------------------------------------------------------------------------------------
# masking

# "scheme://[user]:password@". The password runs to the *last* '@' (SQLAlchemy's own URL grammar
# reads it as [^@]*), so a password holding '/', '?' or '#' is still masked whole. Masking too much
# of an odd URL is acceptable; showing part of a password is not.
_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@]*):(?P<pw>.*)@(?P<tail>[^@]*)$", re.S)
_SECRET_PARAMS = {"password", "passwd", "pwd", "secret", "token"}


def mask_url(url: str) -> str:
    """`postgresql://u:secret@h/db` -> `postgresql://u:***@h/db`. Paths and password-less URLs are unchanged."""
    if "://" not in url:
        return url  # a bare path (e.g. the default JournalFile studies.db) holds no secret
    out = url
    m = _USERINFO.match(out)
    if m is not None:
        out = f"{m['head']}:***@{m['tail']}"
    # Some drivers take the password as a query parameter (`?password=...`): mask that too.
    base, sep, query = out.partition("?")
    if sep:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
            masked = [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs]
            out = base + "?" + urlencode(masked, safe="*/:@")
    return out


# --------------------------------------------------------------------------------------------------
# native YAML

_YAML_HEADER = """\
# autotune export: the fastest configuration measured for this pipeline on this machine.
# Apply it:
#   autotune trial --config best.yaml    # re-measure it here
#   autotune train --config best.yaml    # train with it
# Only `config:` and `workload:` are read back; the other sections record what was measured.
# Framework settings: autotune export --format lightning | hf | accelerate
"""


def _plain(x: Any) -> Any:
    """Reduce a value to what yaml.safe_dump can write (it refuses tuples, paths, numpy scalars)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_plain(v) for v in x]
    item = getattr(x, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return _plain(item())
        except (TypeError, ValueError):
            pass
    return str(x)


def _section(key: str, value: Any) -> str:
    return yaml.safe_dump({key: _plain(value)}, sort_keys=False, default_flow_style=False, allow_unicode=True)


def to_yaml(e: Export) -> str:
    """The native format. Sections are dumped one by one so the file reads with a blank line between them."""
    metrics = {k: e.metrics.get(k) for k in METRIC_KEYS}
    metrics.update({k: v for k, v in e.metrics.items() if k not in metrics})
    study = dict(e.study)
    if isinstance(study.get("storage"), str):
        study["storage"] = mask_url(study["storage"])
    sections = [
        ("config", e.config.knobs()),  # KNOBS order: the contract shared with search spaces
        ("workload", e.config.workload()),
        ("metrics", metrics),
        ("baseline", {"samples_per_s": e.baseline_samples_per_s}),
        ("speedup", e.speedup),
        ("environment", e.environment),
        ("study", study),
        ("reproduce", e.reproduce),
    ]
    return _YAML_HEADER + "\n" + "\n".join(_section(k, v) for k, v in sections)


def load_config(path: str | os.PathLike[str]) -> TrialConfig:
    """Read a flat TrialConfig (YAML or JSON) or an exported file. Every failure is one ConfigError line naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config: {getattr(exc, 'strerror', None) or exc}") from None
    data: Any
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    else:
        try:
            data = yaml.safe_load(text)  # never yaml.load: a config file must not run code
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, Mapping):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{p}: a config must be a mapping of knob: value, got {got}")
    data = _fix_yaml_off(data)
    try:
        return TrialConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a value of the wrong type that a comparison tripped on
        raise ConfigError(f"{p}: bad config value: {exc}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} (line {mark.line + 1})" if mark is not None else str(problem)


def _fix_yaml_off(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """YAML 1.1 reads a hand-written bare `compile: off` as False; that can only have meant 'off'."""
    def fix(d: Mapping[str, Any]) -> Mapping[str, Any]:
        return {**d, "compile": "off"} if d.get("compile") is False else d

    if isinstance(data.get("config"), Mapping):
        return {**data, "config": fix(data["config"])}
    return fix(data)


# --------------------------------------------------------------------------------------------------
# framework renderings


def _knob_table(cfg: TrialConfig, where: Mapping[str, str]) -> str:
    """One comment line per knob, in KNOBS order. A knob missing from `where` is a KeyError, on purpose:
    a new knob must be given a place in every target rather than vanish from it."""
    width = max(len(k) for k in KNOBS)
    rows = [f"#   {k:<{width}} = {_show(getattr(cfg, k)):<12} -> {where[k]}" for k in KNOBS]
    return "\n".join(rows)


def _show(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


_LIGHTNING_PRECISION = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}
_ADAMW_KW = {"none": "foreach=False", "foreach": "foreach=True", "fused": "fused=True"}


def _accelerator(device: str | None) -> str:
    if device is None:
        return "auto"
    return "gpu" if device.startswith("cuda") else "cpu" if device.startswith("cpu") else "auto"


def _optimizer_expr(cfg: TrialConfig, params: str) -> str:
    if cfg.optimizer_fusion == "apex":
        return f"apex.optimizers.FusedAdam({params}, lr={cfg.lr!r}, adam_w_mode=True)"
    return f"torch.optim.AdamW({params}, lr={cfg.lr!r}, {_ADAMW_KW[cfg.optimizer_fusion]})"


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
        "channels_last": "no Trainer flag: AutotuneHooks converts model and batches" if cfg.channels_last
        else "no Trainer flag; off, nothing to do",
        "cudnn_benchmark": "trainer_kwargs['benchmark'] (sets torch.backends.cudnn.benchmark)",
        "compile": "no Trainer flag: torch.compile(model) before trainer.fit (see below)",
        "persistent_workers": "dataloader_kwargs['persistent_workers']",
        "prefetch_factor": "dataloader_kwargs['prefetch_factor']",
        "set_to_none": "AutotuneHooks.optimizer_zero_grad",
        "num_threads": "torch.set_num_threads (see below)" if cfg.num_threads else "0 = torch's default; nothing to set",
    }
    trainer = [
        f"    accelerator={_accelerator(device)!r},",
        f"    devices={cfg.gpus!r},",
    ]
    if multi:
        trainer.append("    strategy='ddp',  # one process per device, as autotune measured it")
    trainer += [
        f"    precision={_LIGHTNING_PRECISION[cfg.precision]!r},",
        f"    benchmark={cfg.cudnn_benchmark!r},  # cudnn_benchmark",
    ]
    loader = [
        f"    batch_size={cfg.batch_size!r},  # per process",
        f"    num_workers={cfg.num_workers!r},",
        f"    pin_memory={cfg.pin_memory!r},",
        f"    persistent_workers={cfg.persistent_workers!r},",
        f"    prefetch_factor={cfg.prefetch_factor!r},",
    ]
    hooks = [
        "class AutotuneHooks:",
        '    """Mix into your module: class MyModule(AutotuneHooks, lightning.pytorch.LightningModule)."""',
        "",
        "    def configure_optimizers(self):",
        f"        # optimizer_fusion={cfg.optimizer_fusion}; lr is the one autotune measured with, use your own",
        f"        return {_optimizer_expr(cfg, 'self.parameters()')}",
        "",
        "    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):",
        f"        optimizer.zero_grad(set_to_none={cfg.set_to_none!r})  # set_to_none",
    ]
    if cfg.channels_last:
        hooks += [
            "",
            "    def on_fit_start(self):",
            "        self.to(memory_format=torch.channels_last)  # channels_last: the weights",
            "",
            "    def on_after_batch_transfer(self, batch, dataloader_idx):",
            "        # channels_last: the 4-D inputs (images); other tensors pass through",
            "        def cl(x):",
            "            return x.contiguous(memory_format=torch.channels_last) "
            "if torch.is_tensor(x) and x.dim() == 4 else x",
            "        return [cl(x) for x in batch] if isinstance(batch, (list, tuple)) else cl(batch)",
        ]
    extra = []
    if cfg.num_threads:
        extra.append(f"torch.set_num_threads({cfg.num_threads!r})  # num_threads, before building the DataLoader")
    extra.append(f"# compile={cfg.compile}: "
                 + ("no change" if cfg.compile == "off"
                    else f"model = torch.compile(model, mode={cfg.compile!r}) before trainer.fit(model)"))
    extra.append(f"# checkpoint_segments={cfg.checkpoint_segments}: "
                 + ("off" if cfg.checkpoint_segments == 0 else
                    f"in forward(), run the first {cfg.checkpoint_segments} encoder stages through "
                    "torch.utils.checkpoint.checkpoint(stage, x, use_reentrant=False)"))
    parts = [
        "# Lightning (lightning.pytorch) settings for the configuration autotune measured.",
        "# Every tuned knob, and where it goes:",
        _knob_table(cfg, where),
        "import torch",
        *(["import apex.optimizers  # optimizer_fusion=apex needs NVIDIA apex"] if cfg.optimizer_fusion == "apex" else []),
        "",
        "trainer_kwargs = dict(", *trainer, ")",
        "",
        "dataloader_kwargs = dict(", *loader, ")",
        "",
        *hooks,
        "",
        *extra,
        "",
        "# trainer = lightning.pytorch.Trainer(**trainer_kwargs)",
        "# trainer.fit(model, torch.utils.data.DataLoader(dataset, shuffle=True, **dataloader_kwargs))",
    ]
    return "\n".join(parts) + "\n"


_HF_OPTIM = {"none": "adamw_torch", "foreach": "adamw_torch", "fused": "adamw_torch_fused", "apex": "adamw_apex_fused"}


def to_hf(cfg: TrialConfig, *, device: str | None = None) -> str:
    """Python for transformers.TrainingArguments, plus comments for what TrainingArguments cannot hold."""
    n = cfg.gpus
    launch = (f"torchrun --nproc-per-node {n} train.py  (or: accelerate launch --num_processes {n} train.py)"
              if n > 1 else "python train.py (one process)")
    where = {
        "num_workers": "dataloader_num_workers",
        "pin_memory": "dataloader_pin_memory",
        "batch_size": "per_device_train_batch_size",
        "precision": "bf16 / fp16",
        "optimizer_fusion": f"optim={_HF_OPTIM[cfg.optimizer_fusion]!r}",
        "checkpoint_segments": "gradient_checkpointing (every layer, see below)",
        "gpus": f"not a TrainingArguments field: launch with {launch}",
        "channels_last": "not a TrainingArguments field (see below)",
        "cudnn_benchmark": "not a TrainingArguments field: torch.backends.cudnn.benchmark (below)",
        "compile": "torch_compile / torch_compile_mode",
        "persistent_workers": "dataloader_persistent_workers",
        "prefetch_factor": "dataloader_prefetch_factor",
        "set_to_none": "not a TrainingArguments field (see below)",
        "num_threads": "not a TrainingArguments field: torch.set_num_threads (below)" if cfg.num_threads
        else "0 = torch's default; nothing to set",
    }
    args = [
        f"    per_device_train_batch_size={cfg.batch_size!r},",
        f"    dataloader_num_workers={cfg.num_workers!r},",
        f"    dataloader_pin_memory={cfg.pin_memory!r},",
        f"    dataloader_persistent_workers={cfg.persistent_workers!r},",
        f"    dataloader_prefetch_factor={cfg.prefetch_factor!r},",
        f"    bf16={cfg.precision == 'bf16'!r},",
        f"    fp16={cfg.precision == 'fp16'!r},",
        f"    optim={_HF_OPTIM[cfg.optimizer_fusion]!r},  # optimizer_fusion={cfg.optimizer_fusion}",
    ]
    if cfg.checkpoint_segments:
        args.append(f"    gradient_checkpointing=True,  # checkpoint_segments={cfg.checkpoint_segments}: "
                    "HF checkpoints every layer, not the first k")
    else:
        args.append("    gradient_checkpointing=False,  # checkpoint_segments=0")
    args.append(f"    torch_compile={cfg.compile != 'off'!r},  # compile={cfg.compile}")
    if cfg.compile != "off":
        args.append(f"    torch_compile_mode={cfg.compile!r},")
    if device is not None and device.startswith("cpu"):
        args.append("    use_cpu=True,  # autotune measured this on CPU")
    notes = [f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark!r}  # cudnn_benchmark"]
    if cfg.num_threads:
        notes.append(f"torch.set_num_threads({cfg.num_threads!r})  # num_threads")
    notes += [
        f"# gpus={n}: launch with {launch}",
        f"# channels_last={cfg.channels_last}: "
        + ("model = model.to(memory_format=torch.channels_last) before Trainer(...), and return 4-D "
           "image batches as .contiguous(memory_format=torch.channels_last) from the data collator"
           if cfg.channels_last else "off, nothing to do"),
        f"# set_to_none={cfg.set_to_none}: Trainer calls model.zero_grad(), which frees grads (set_to_none=True) "
        "in torch >= 2.0" + ("" if cfg.set_to_none else "; to keep zeroed grads, override Trainer.training_step"),
    ]
    if cfg.checkpoint_segments:
        notes.append(f"# checkpoint_segments={cfg.checkpoint_segments}: gradient_checkpointing needs a model with "
                     "gradient_checkpointing_enable() (a transformers PreTrainedModel); it saves more memory and "
                     "costs more time than autotune's first-k segments")
    if cfg.optimizer_fusion == "none":
        notes.append("# optimizer_fusion=none: 'adamw_torch' lets torch choose (foreach on CUDA). To force the "
                     "for-loop AdamW: Trainer(optimizers=(torch.optim.AdamW(model.parameters(), foreach=False), None))")
    elif cfg.optimizer_fusion == "foreach":
        notes.append("# optimizer_fusion=foreach: 'adamw_torch' uses torch's foreach AdamW on CUDA by default")
    parts = [
        "# transformers.TrainingArguments fields for the configuration autotune measured.",
        "# Every tuned knob, and where it goes:",
        _knob_table(cfg, where),
        "import torch",
        "",
        "training_args = dict(", *args, ")",
        "",
        *notes,
        "",
        "# args = transformers.TrainingArguments(output_dir='out', **training_args)",
    ]
    return "\n".join(parts) + "\n"


_ACC_PRECISION = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}


def to_accelerate(cfg: TrialConfig, *, device: str | None = None) -> str:
    """An `accelerate launch --config_file` YAML, with comments for the knobs accelerate does not hold."""
    on_cpu = device is not None and device.startswith("cpu")
    n = cfg.gpus
    dist = ("MULTI_CPU" if on_cpu else "MULTI_GPU") if n > 1 else "NO"
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
    }
    if cfg.compile != "off":
        conf["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": cfg.compile,
            "dynamo_use_dynamic": False,
            "dynamo_use_fullgraph": False,
        }
    in_script = "not an accelerate setting: in your script"
    where = {
        "num_workers": f"{in_script}, DataLoader(num_workers=...)",
        "pin_memory": f"{in_script}, DataLoader(pin_memory=...)",
        "batch_size": f"{in_script}, DataLoader(batch_size=...) per process",
        "precision": f"mixed_precision: {_ACC_PRECISION[cfg.precision]}",
        "optimizer_fusion": f"{in_script}, {_optimizer_expr(cfg, 'model.parameters()')}",
        "checkpoint_segments": f"{in_script}, torch.utils.checkpoint on the first k blocks"
        if cfg.checkpoint_segments else "off, nothing to do",
        "gpus": f"num_processes: {n}, distributed_type: {dist}",
        "channels_last": f"{in_script}, model.to(memory_format=torch.channels_last) + 4-D inputs"
        if cfg.channels_last else "off, nothing to do",
        "cudnn_benchmark": f"{in_script}, torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark}",
        "compile": "dynamo_config (backend INDUCTOR, dynamo_mode)" if cfg.compile != "off"
        else "off: no dynamo_config",
        "persistent_workers": f"{in_script}, DataLoader(persistent_workers=...)",
        "prefetch_factor": f"{in_script}, DataLoader(prefetch_factor=...)",
        "set_to_none": f"{in_script}, optimizer.zero_grad(set_to_none={cfg.set_to_none})",
        "num_threads": f"{in_script}, torch.set_num_threads({cfg.num_threads})" if cfg.num_threads
        else "0 = torch's default; nothing to set",
    }
    header = [
        "# accelerate config for the configuration autotune measured.",
        "# Use: accelerate launch --config_file accelerate.yaml train.py",
        "# accelerate holds the process layout, mixed precision and torch.compile; the DataLoader and",
        "# optimizer knobs stay in your script. Every tuned knob, and where it goes:",
        _knob_table(cfg, where),
        "",
    ]
    return "\n".join(header) + yaml.safe_dump(conf, sort_keys=True, default_flow_style=False)


# --------------------------------------------------------------------------------------------------
# dispatch and writing


def render(fmt: str, e: Export) -> str:
    """Render an Export in one of FORMATS; the device it was measured on picks accelerator/use_cpu."""
    device = e.environment.get("device")
    device = device if isinstance(device, str) else None
    renderers: dict[str, Callable[[], str]] = {
        "yaml": lambda: to_yaml(e),
        "lightning": lambda: to_lightning(e.config, device=device),
        "hf": lambda: to_hf(e.config, device=device),
        "accelerate": lambda: to_accelerate(e.config, device=device),
    }
    if fmt not in renderers:
        raise ConfigError(f"unknown export format {fmt!r}; choose one of {'|'.join(FORMATS)}")
    return renderers[fmt]()


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write via a temp file in the same directory and os.replace, so a reader never sees half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file 0600; an export is meant to be shared, so keep the old mode or use 0644.
        os.chmod(tmp, p.stat().st_mode & 0o777 if p.exists() else 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
