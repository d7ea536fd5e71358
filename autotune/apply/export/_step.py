"""The optimizer step a trial took (its global batch and the lr that follows it, the optimizer's
implementation, zero_grad), in every export's terms: a framework's fields and hooks, the script's lines,
the diff's edits."""

from __future__ import annotations

import ast
import math
from typing import TYPE_CHECKING, Any

from autotune.core.config import TrialConfig, lr_factor
from autotune.core.knobs import optimizer_fusion
from autotune.core.knobs.optimizer_fusion import WEIGHT_DECAY
from autotune.core.knobs.row import IN_SCRIPT
from autotune.pipelines.script import source

if TYPE_CHECKING:
    from autotune.apply.export.diff import Rewrite


def rows(cfg: TrialConfig, target: str) -> dict[str, str]:
    """The knob table's rows for the optimizer's implementation and zero_grad, in `target`'s terms."""
    if target == "lightning":
        return {
            "optimizer_fusion": "AutotuneHooks.configure_optimizers",
            "set_to_none": "AutotuneHooks.optimizer_zero_grad",
        }
    if target == "hf":
        return {
            "optimizer_fusion": f"optim={optimizer_fusion.HF[cfg.optimizer_fusion]!r}",
            "set_to_none": "not a TrainingArguments field (see below)",
        }
    return {
        "optimizer_fusion": f"{IN_SCRIPT}, {optimizer_expr(cfg, 'model.parameters()')}",
        "set_to_none": f"{IN_SCRIPT}, {zero_grad_call(cfg)}",
    }


def optimizer_expr(cfg: TrialConfig, params: str) -> str:
    if cfg.optimizer_fusion == "apex":
        # apex's weight decay defaults to 0 and its zero_grad() takes no set_to_none: both go here.
        return (
            f"apex.optimizers.FusedAdam({params}, lr={cfg.effective_lr!r}, adam_w_mode=True, "
            f"weight_decay={WEIGHT_DECAY}, set_grad_none={cfg.set_to_none!r})"
        )
    return (
        f"torch.optim.AdamW({params}, lr={cfg.effective_lr!r}, weight_decay={WEIGHT_DECAY}, "
        f"{optimizer_fusion.flags(cfg.optimizer_fusion)})"
    )


def zero_grad_call(cfg: TrialConfig) -> str:
    """apex's FusedAdam.zero_grad() takes no arguments (set_grad_none was given to its constructor)."""
    if cfg.optimizer_fusion == "apex":
        return (
            "optimizer.zero_grad()"
            if cfg.set_to_none
            else "torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)"
        )
    return f"optimizer.zero_grad(set_to_none={cfg.set_to_none!r})"


def imports(cfg: TrialConfig) -> list[str]:
    return (
        ["import apex.optimizers  # optimizer_fusion=apex needs NVIDIA apex"] if cfg.optimizer_fusion == "apex" else []
    )


def training_lines(cfg: TrialConfig) -> list[str]:
    """Comment lines: the optimizer step this config computes (global batch, accumulation, lr and its rule)."""
    lines = [
        f"# global batch {cfg.global_batch_size} = {cfg.batch_size} per process x {cfg.gpus} process(es) x "
        f"{cfg.grad_accum} accumulation step(s)"
    ]
    if cfg.effective_lr != cfg.lr:
        lines.append(
            f"# lr {cfg.effective_lr:.6g}: {cfg.lr:g} for global batch {cfg.reference_batch}, scaled by the "
            f"{cfg.lr_scaling} rule for {cfg.global_batch_size}"
        )
    else:
        lines.append(
            f"# lr {cfg.effective_lr:g}: the learning rate autotune trained with (global batch {cfg.global_batch_size})"
        )
    return lines


def lightning_hooks(cfg: TrialConfig) -> list[str]:
    return [
        "    def configure_optimizers(self):",
        f"        # optimizer_fusion={cfg.optimizer_fusion}; lr for global batch {cfg.global_batch_size} "
        f"({cfg.lr_scaling} rule if it was scaled)",
        f"        return {optimizer_expr(cfg, 'self.parameters()')}",
        "",
        "    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):",
        f"        {zero_grad_call(cfg)}  # set_to_none={cfg.set_to_none!r}",
    ]


def hf_args(cfg: TrialConfig) -> list[str]:
    """The step's TrainingArguments: accumulation, lr, and the trials' AdamW: decay 0.01 at a constant lr.
    TrainingArguments defaults to no decay and an lr decaying linearly to 0, which would train something
    other than what was measured."""
    return [
        f"    gradient_accumulation_steps={cfg.grad_accum!r},  # global batch {cfg.global_batch_size}",
        f"    learning_rate={cfg.effective_lr!r},",
        f"    weight_decay={WEIGHT_DECAY!r},",
        "    lr_scheduler_type='constant',",
    ]


def hf_optim(cfg: TrialConfig) -> list[str]:
    return [f"    optim={optimizer_fusion.HF[cfg.optimizer_fusion]!r},  # optimizer_fusion={cfg.optimizer_fusion}"]


def hf_notes(cfg: TrialConfig) -> list[str]:
    notes = [
        f"# set_to_none={cfg.set_to_none}: Trainer calls model.zero_grad(), which frees grads (set_to_none=True) "
        "in torch >= 2.0" + ("" if cfg.set_to_none else "; to keep zeroed grads, override Trainer.training_step"),
        f"# weight_decay={WEIGHT_DECAY}: the Trainer exempts biases and LayerNorm weights from it; the trials "
        "decayed every parameter",
    ]
    if cfg.optimizer_fusion == "none":
        notes.append(
            "# optimizer_fusion=none: 'adamw_torch' lets torch choose (foreach on CUDA). To force the "
            "for-loop AdamW: Trainer(optimizers=(torch.optim.AdamW(model.parameters(), foreach=False), None))"
        )
    elif cfg.optimizer_fusion == "foreach":
        notes.append("# optimizer_fusion=foreach: 'adamw_torch' uses torch's foreach AdamW on CUDA by default")
    return notes


def script_lines(cfg: TrialConfig) -> list[str]:
    """The script's optimizer flag and zero_grad, as the trial set them."""
    flag = {"fused": "fused=True", "foreach": "foreach=True", "none": "foreach=False, fused=False"}
    out = []
    if cfg.optimizer_fusion in flag:
        out.append(
            f"torch.optim.YourOptimizer(..., {flag[cfg.optimizer_fusion]})  # optimizer_fusion={cfg.optimizer_fusion}"
        )
    out.append(f"optimizer.zero_grad(set_to_none={cfg.set_to_none})")
    return out


def edit(rw: Rewrite) -> None:
    """The optimizers' fused/foreach flags, zero_grad(set_to_none=...), at.accumulation()'s default, and the
    lr the trial scaled for the global batch it ran."""
    _fusion(rw)
    for call in rw.calls_to("zero_grad"):
        if isinstance(call.func, ast.Attribute):  # optimizer.zero_grad(), not a function of that name
            rw.set_keyword(call, "set_to_none", rw.cfg.set_to_none, True, position=0)
    cfg, own = rw.cfg, rw.job.own
    if cfg.global_batch is not None and own is not None and cfg.grad_accum != own[1]:
        for call in rw.api("accumulation"):
            rw.default(call, cfg.grad_accum)
    _lr(rw)


def _fusion(rw: Rewrite) -> None:
    """The fused/foreach flags of the optimizers a trial stepped, wherever the script built them (another
    module too), where the implementation it ran differs from the one the script's own flags pick.
    Without a record of which stepped: every fusable optimizer call in the script, as a trial that is not
    the baseline sets both flags on each."""
    fusion = rw.cfg.optimizer_fusion
    if "optimizer_fusion" in rw.skip:
        return
    if fusion == "apex":
        rw.notes.append("optimizer_fusion=apex: construct apex.optimizers.FusedAdam in place of your optimizer")
        return
    sites = rw.sites("optimizers")
    names = source.LINEAR_RULE | source.SQRT_RULE | source.OTHER_OPTIMIZERS
    built = [rw.callee(c) for c in rw.calls] if sites is None else [s.record.get("type") for s in sites if s.used()]
    flagless = sorted({str(n) for n in built if n in names - optimizer_fusion.FUSABLE - {"FusedAdam", "FusedLAMB"}})
    if flagless and fusion != "none":
        rw.notes.append(
            f"optimizer_fusion={fusion}: {', '.join(flagless)} takes no fused/foreach pair, so the trial left "
            "its flags as written"
        )
    if sites is None:
        for call in rw.calls_to(*optimizer_fusion.FUSABLE):
            _flags(rw, rw, call, fusion, written=True)
        return
    for site in sites:
        ran = site.record.get("ran") or fusion
        if (
            site.used()
            and site.record.get("type") in optimizer_fusion.FUSABLE
            and ran != own_fusion(site.record.get("own"), rw.device)
        ):
            _flags(rw, site.src, site.call, ran, written=False)


def own_fusion(own: Any, device: str) -> str:
    """The implementation an optimizer's own flags pick: foreach=None is torch's default, foreach on CUDA
    tensors and the for-loop on the CPU."""
    own = own if isinstance(own, dict) else {}
    if own.get("fused"):
        return "fused"
    if own.get("foreach") or (own.get("foreach") is None and device == "cuda"):
        return "foreach"
    return "none"


def _flags(rw: Rewrite, src: Any, call: ast.Call, fusion: str, written: bool) -> None:
    """`fusion`'s flag on `call`, and the other flag, where the script gives it, made not to contradict
    (torch refuses both True). `written`: today's rule for a study without sites (every flag as the trial
    set it, an expression replaced by the value)."""
    other = "fused" if fusion in ("none", "foreach") else "foreach"
    flag, value = ("foreach", False) if fusion == "none" else (fusion, True)
    if written:
        rw.set_keyword(call, flag, value, (False if rw.device == "cpu" else None) if fusion == "none" else None)
        given = next((k.value for k in call.keywords if k.arg == other), None)
        if given is not None and not rw.same(given, False):
            rw.replace(given, "False")
        return
    if fusion != "none" or src.argument(call, flag, None) is not None or rw.device != "cpu":
        rw.write(src, call, flag, value)
    given = src.argument(call, other, None)
    if given is not None and not rw.same(given, False):
        rw.write(src, call, other, False)


def _lr(rw: Rewrite) -> None:
    """The factor the trial put on the script's own lr for the global batch it ran (the trial's
    batch_handover): at.lr()'s default, else the lr its optimizer constructors are given."""
    own, cfg = rw.job.own, rw.cfg
    if own is None:
        return
    ran = cfg.global_batch_with(own[1])
    factor = lr_factor(ran / (own[0] * own[1]), cfg.lr_scaling)
    if rw.job.option_rule is not None:  # its own lr arithmetic follows the option set: divided out
        factor /= lr_factor(cfg.batch_size / own[0], rw.job.option_rule)
    if math.isclose(factor, 1):
        return
    if any(site.get("own_schedule") for site in (rw.recorded or {}).get("optimizers", [])):
        rw.notes.append(
            f"lr: the script sets its optimizer's lr itself before its steps (a schedule of its own), over the lr "
            f"it is built with; the trial scaled each value it set by {factor:.6g}: multiply what it sets by "
            f"{factor:.6g} (autotune run does)"
        )
    targets = [c.args[0] if c.args else None for c in rw.api("lr")]
    if not targets:
        names = source.LINEAR_RULE | source.SQRT_RULE | source.OTHER_OPTIMIZERS
        targets = [rw.lr_argument(c) for c in rw.calls_to(*names)]
    for node in targets:
        if node is None:
            rw.notes.append(
                f"lr: the optimizer runs at its default lr; the trial scaled it by {factor:.6g} "
                f"({cfg.lr_scaling} rule, global batch {own[0] * own[1]} -> {ran}): give it lr=<default> * {factor:.6g}"
            )
        else:
            rw.replace(node, f"{rw.text(node)} * {factor:.6g}")
