"""precision's torch side (its story: autotune/core/knobs/precision.py). Autotune's pipelines: autocast and a
GradScaler on every path, fp32 disabling both (`Precision`). An unedited script: autocast around the forward of the model its optimizer trains, entered
at the model's forward pre-hook and left at its forward hook (one hook pair on one module, not a global hook
on every module call). The model's floating outputs are handed back in fp32, so a loss the script computes
outside the model runs in fp32, as it would under autocast. Inside a script's own autocast the trial's
precision runs in its place (fp32: autocast off), and that is said. Observed: the dtype of the model's
output inside the autocast, before it is handed back.

With at.autocast() the trial's precision is handed over instead (`handed_record`, `handed_seen`: what the
model's forward showed). The baseline's model is only watched (`watch`): the precision the script runs at.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.effects import knob_effect
from autotune.core.knobs.precision import NAME as NAME
from autotune.pipelines.script import api
from autotune.core.effects import AS_WRITTEN
from autotune.trial.measurement import observe

if TYPE_CHECKING:
    from autotune.trial.loop.script.model import Found

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def first_floating(output: Any) -> torch.Tensor | None:
    """The first floating tensor of a forward's output (a tensor, a tuple or list, a dict, a dataclass)."""
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else ()
    for value in values:
        if (found := first_floating(value)) is not None:
            return found
    return None


def to_fp32(output: Any) -> Any:
    """`output` with each low-precision floating tensor cast to fp32, its containers rebuilt alike."""
    if isinstance(output, torch.Tensor):
        return output.float() if output.dtype in (torch.bfloat16, torch.float16) else output
    if isinstance(output, tuple) and hasattr(output, "_fields"):  # a namedtuple
        return type(output)(*(to_fp32(v) for v in output))
    if isinstance(output, (list, tuple)):
        return type(output)(to_fp32(v) for v in output)
    if isinstance(output, dict):
        return type(output)((k, to_fp32(v)) for k, v in output.items()) if type(output) is dict else output
    return output


class Autocast:
    """The hook pair on one model: `precision` ("fp32" turns autocast off, inside a script's own too)."""

    def __init__(self, precision: str, device_type: str) -> None:
        self.precision, self.device_type = precision, device_type
        self.entered: list[Any] = []
        self.outer: str | None = None  # the script's own autocast around the model, when it ran one
        self.seen: str | None = None  # the output dtype inside, on the first forward

    def pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if torch.is_autocast_enabled(self.device_type) and self.outer is None:
            self.outer = NAMES.get(torch.get_autocast_dtype(self.device_type), "?")
        on = self.precision != "fp32"
        ctx = torch.autocast(self.device_type, dtype=DTYPES[self.precision] if on else torch.bfloat16, enabled=on)
        ctx.__enter__()
        self.entered.append(ctx)

    def post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if self.entered:
            self.entered.pop().__exit__(None, None, None)
        if self.seen is None:
            self.seen = observed_dtype(output)
        return to_fp32(output)


class Watched:
    """The baseline's model, only watched (no autocast entered): the precision its first floating output came
    in, the script's own."""

    def __init__(self) -> None:
        self.seen: str | None = None

    def post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.seen is None:
            self.seen = observed_dtype(output)


class Precision:
    """autocast + GradScaler, both present on every path; fp32 disables them."""

    def __init__(self, cfg: TrialConfig, device: torch.device) -> None:
        self.device_type = device.type
        self.dtype = DTYPES[cfg.precision]
        self.enabled = cfg.precision != "fp32"
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
        why = f"autocast({device.type}, {cfg.precision}) around the forward and the loss" if self.enabled else ""
        if cfg.precision == "fp16" and device.type != "cuda":
            why += "; no CUDA device: fp16 autocast runs on CPU, without tensor cores"
        self.applied = {
            "precision": knob_effect(cfg.precision, cfg.precision if self.enabled else "fp32", why),
            "grad_scaler": self.scaler.is_enabled(),
        }

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


# ---- an unedited script's model (trial/loop/script/model.py calls these by the knob list) ----------------


def seam(
    model: torch.nn.Module, cfg: TrialConfig, args: tuple[Any, ...], hooks: list[Any]
) -> tuple[Autocast, tuple[Any, ...]]:
    """The hook pair on the model, entered for this call too (its pre-hooks were listed before it was added)."""
    autocast = Autocast(cfg.precision, next(model.parameters()).device.type)
    hooks.append(model.register_forward_pre_hook(autocast.pre))
    hooks.append(model.register_forward_hook(autocast.post))
    autocast.pre(model, args)
    return autocast, args


def watch(model: torch.nn.Module, hooks: list[Any]) -> Watched:
    """The baseline's model: a forward hook that reads the precision it runs at, as the script wrote it."""
    watched = Watched()
    hooks.append(model.register_forward_hook(watched.post))
    return watched


def seen(found: Found, cfg: TrialConfig, state: Autocast | Watched | None) -> tuple[str, str]:
    if not isinstance(state, Autocast):  # the baseline (watched: the script's own precision), or its precision kept
        own = (state.seen if state is not None else None) or baseline_of(cfg).precision
        return own, f"the script's own: its model returned {own}"
    said = f"{found.where}: autocast around its forward, its outputs handed back in fp32"
    if state.outer is not None:
        said += f"; inside the script's own autocast ({state.outer}), which the trial's replaced there"
    return state.seen or "fp32", said


def observed(found: Found, state: Autocast | Watched | None) -> dict[str, Any]:
    return {"model_output_precision": state.seen if state is not None else None}


def recorded(state: Autocast | Watched | None) -> dict[str, Any]:
    """What trial 0's lessons read of the model (search/space/resolve.py): the precision the script's own model
    returned, watched in the baseline."""
    return {"own_precision": state.seen} if isinstance(state, Watched) and state.seen else {}


def observed_dtype(output: Any) -> str | None:
    """The precision name of a forward's first floating output (the baseline's, watched without a hook pair)."""
    t = first_floating(output)
    return None if t is None else NAMES.get(t.dtype, str(t.dtype).removeprefix("torch."))


PRECISION_OF_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def handed_record(trial: api.Trial) -> dict[str, Any]:
    """The script's own AMP: what at.autocast() entered (and an autocast of the script's around it), and
    whether at.scaler()'s GradScaler scaled."""
    out: dict[str, Any] = {}
    if "autocast" in trial.calls:
        out["autocast"] = dict(trial.autocasts)
        if trial.outer_autocast is not None:
            out["outer_autocast"] = trial.outer_autocast
    if trial.scalers:
        scaling = [s for s in trial.scalers if observe.scaled(s)]
        out["grad_scaler"] = {"enabled": trial.scalers[0].is_enabled(), "scaled": bool(scaling)}
    return out


def handed_seen(trial: api.Trial, seen: dict[str, Any], as_written: bool) -> tuple[Any, str]:
    """The precision the model ran at, as its forward showed it (the output dtype of its first layer, else
    its own): not the config's echo. Without a model handed to at.model() (or one the trial compiled), what
    at.autocast() entered, on the device the script's tensors live on."""
    own = trial.defaults.get("precision", "fp32")
    entered = sorted(trial.autocasts, key=lambda k: -trial.autocasts[k])
    said = [f"at.autocast() ran {', '.join(f'{k} x{trial.autocasts[k]}' for k in entered)}"]
    dtype = seen.get("first_layer_output_dtype") or seen.get("output_dtype")
    if dtype is not None:
        in_effect = PRECISION_OF_DTYPE.get(dtype, dtype)
        where = "its first layer's" if seen.get("first_layer_output_dtype") else "its"
        said.append(f"the model at.model() got returned {dtype} ({where} output)")
    else:
        in_effect = entered[0].split(" on ")[0] if entered else own
        said.append("its model's output was not watched (none handed to at.model(), or compiled)")
    outer = trial.outer_autocast
    if outer is not None:
        said.append(
            f"the script's own autocast({outer['device_type']}, {outer['dtype']}) encloses at.autocast(): "
            + (
                "the baseline keeps it, as the script runs alone"
                if as_written
                else "the trial's precision replaced it inside at.autocast() only; give its dtype to "
                "at.autocast() (at.autocast(torch.bfloat16)) in its place"
            )
        )
    if as_written:
        said.append(f"{AS_WRITTEN}: at.autocast({own!r})")
    return in_effect, "; ".join(said)
