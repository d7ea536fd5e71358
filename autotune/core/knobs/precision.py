"""precision: fp32, or the model's forward under bf16 or fp16 autocast (fp16 with a GradScaler, whose loss
scaling keeps fp16's small gradients from flushing to zero). It changes the rounding of the training math: a
class that parity checks against the baseline's loss trajectory.

- Its space rules: fp16 needs CUDA; bf16 on a CPU without native bf16 (AVX512-BF16 or AMX) is emulated, about
  70x slower than fp32; a script whose fp16 has no GradScaler handed over cannot take fp16. The warm start
  (`guide`): bf16 where the devices compute it natively, else fp16 on CUDA.
- Autotune's pipelines: autocast around the forward and the loss, a GradScaler on every path, enabled for
  fp16 only (trial/loop/knobs/precision.py).
- An unedited script: autocast entered at a forward pre-hook of the model its optimizer trains and left at its
  forward hook, its floating outputs handed back in fp32 (a loss outside it stays fp32); with `at.autocast()`
  the script's own block takes the trial's precision; its own precision, given to at.autocast() or read from
  its source, is spelled as `SPELLINGS` allows. Its rules there (`script_own`, `script_why`, `script_refused`):
  the precision its source gives at.autocast() is the baseline's, one the source cannot read keeps it fixed,
  and fp16 needs its GradScaler handed over (at.scaler()). Observed: the dtype of the model's output; in the
  baseline, the precision the script runs at (`watched_own`: trial 0's lesson).
- The exports: the lines below, in each target's terms.

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from autotune.core.errors import PipelineError
from autotune.core.knobs.row import Drop, Guided, Machine, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "precision"
VALUES = ("fp32", "fp16", "bf16")
ROW = knob(
    "fp32",
    "fp32, or bf16/fp16 autocast (fp16 with a GradScaler)",
    choices=VALUES,
    visit=0,
    math="precision",
    memory=True,
)
ROUTE = "autocast"
NOT_IN: dict[str, str] = {}
# Each value as the torch dtype autocast is given, and in each framework's terms.
DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
# Each value as a script may spell it (to at.autocast(), in its source): autotune's name, or a torch dtype's
# (torch.bfloat16 is "bfloat16").
SPELLINGS = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
}  # fmt: skip
NO_SCALER = "fp16 needs loss scaling: hand your GradScaler over with at.scaler() (autotune.script)"
LIGHTNING = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}
ACCELERATE = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}

HOW = "autocast around the forward of the model the optimizer trains, its outputs back in fp32"
LINES = (
    "def _autocast_in(module, args):  # autotune: precision {p}, autocast around {m}'s forward",
    "    module._autotune_autocast = {autocast}",
    "    module._autotune_autocast.__enter__()",
    "def _autocast_out(module, args, output):  # its floating outputs back in fp32, for a loss outside it",
    "    module._autotune_autocast.__exit__(None, None, None)",
    "    low = (torch.bfloat16, torch.float16)",
    "    return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.float() if t.dtype in low else t, output)",
    "{m}.register_forward_pre_hook(_autocast_in)",
    "{m}.register_forward_hook(_autocast_out)",
)


def machine(hw: Machine) -> list[Rule]:
    if hw.cuda:
        return []
    rules: list[Rule] = [Drop(("fp16",), "fp16 needs CUDA")]
    if not hw.cpu_bf16:
        rules.append(
            Drop(
                ("bf16",),
                "this CPU has no native bf16 (AVX512-BF16 or AMX): autocast would emulate it, about 70x slower than fp32",
            )
        )
    return rules


def guide(on: Guided) -> dict[str, Any]:
    """The guides' AMP: bf16 where the devices compute it natively, else fp16 on CUDA (its GradScaler on), and
    fp32 on a CPU without bf16 kernels, where autocast would emulate it."""
    return {NAME: "bf16" if on.bf16 else "fp16" if on.cuda else "fp32"}


def script_own(said: Any) -> str:
    """The precision a script runs alone, as its source gives at.autocast() one (`said`; fp32 where it gives
    none): one of VALUES, or why it cannot be read."""
    return str(said or "fp32")


def script_why(own: str, calls: Collection[str]) -> str | None:
    """Why a script cannot take it at all: the precision it gives at.autocast() cannot be read, so no trial
    could say which precision its baseline ran."""
    return None if own in VALUES else f"the precision at.autocast() is given cannot be read: {own}"


def script_refused(own: str, calls: Collection[str]) -> dict[str, str]:
    """The values a script cannot take, and why: fp16 without a GradScaler handed over (at.scaler()), unless
    fp16 is what it runs alone (its own scaler scales then). Without loss scaling fp16's small gradients flush
    to zero: its speed would win by noise, and its export would have no scaler."""
    return {"fp16": NO_SCALER} if "scaler" not in calls and own != "fp16" else {}


def watched_own(model: Mapping[str, Any]) -> str | None:
    """The script's own precision as trial 0's run showed it, where no at.autocast() says it (an autocast of its
    own): what its model returned, watched in the baseline (`applied.script.model`, the record the model seams
    make where the trial routes precision to the model); None where the run did not show one of VALUES."""
    ran = model.get("own_precision") if NAME in model.get("routed", ()) else None
    return ran if ran in VALUES else None


def math_change(cfg: TrialConfig, base: TrialConfig) -> str | None:
    """The training math it changes, as core/training.py labels a class."""
    return f"precision {base.precision} -> {cfg.precision}" if cfg.precision != base.precision else None


def autocast(cfg: TrialConfig, device: str) -> str:
    """The torch autocast `cfg`'s precision runs under: fp32 measured over a script's own AMP is one disabled."""
    if cfg.precision in DTYPE:
        return f"torch.autocast({device!r}, dtype={DTYPE[cfg.precision]})"
    return f"torch.autocast({device!r}, enabled=False)"


def writes_lines(cfg: TrialConfig) -> bool:
    """fp16 is not written as LINES: it needs a GradScaler the script does not have."""
    return cfg.precision != "fp16"


def line_fields(cfg: TrialConfig, site: dict[str, object], device: str) -> dict[str, object]:
    return {"p": cfg.precision, "autocast": autocast(cfg, device)}


def api_calls(cfg: TrialConfig, base: TrialConfig, device: str) -> dict[str, str]:
    """The at.* calls a changed precision rewrites, as the torch calls they stand for: outside a trial
    at.autocast(own) and at.scaler(own) run the script's own precision (`base`, fp32 unless it names one), so
    only a measured precision that differs from it is written; the scaler goes on with fp16, or off from it."""
    out = {"autocast": autocast(cfg, device)}
    if "fp16" in (cfg.precision, base.precision):
        on = "" if cfg.precision == "fp16" else ", enabled=False"
        out["scaler"] = f"torch.amp.GradScaler({device!r}{on})"
    return out


def api_lines(cfg: TrialConfig, device: str) -> list[str]:
    if cfg.precision == "fp32":
        return []
    out = [
        f"with at.autocast():  # precision={cfg.precision}: torch.autocast({device!r}, dtype={DTYPE[cfg.precision]})"
    ]
    if cfg.precision == "fp16":
        out.append(f"scaler = at.scaler()  # torch.amp.GradScaler({device!r})")
    return out


def row(cfg: TrialConfig, target: str) -> str:
    if target == "lightning":
        return f"trainer_kwargs['precision'] = {LIGHTNING[cfg.precision]!r}"
    if target == "hf":
        return "bf16 / fp16"
    return f"mixed_precision: {ACCELERATE[cfg.precision]}"


def lightning_trainer(cfg: TrialConfig) -> list[str]:
    return [f"    precision={LIGHTNING[cfg.precision]!r},"]


def lightning_fields(cfg: TrialConfig) -> dict[str, Any]:
    """The Trainer arguments it sets."""
    return {"precision": LIGHTNING[cfg.precision]}


def lightning_own(args: Mapping[str, Any]) -> str | None:
    """The user's own, from their Trainer arguments (None: they name none). One autotune cannot run
    (bf16-true, transformer-engine, ...) is bad input: the baseline would not be the job the user runs."""
    if "precision" not in args:
        return None
    named = {str(v): k for k, v in LIGHTNING.items()} | {"32": "fp32", "16": "fp16", "bf16": "bf16"}
    own = named.get(str(args["precision"]))
    if own is None:
        raise PipelineError(
            f"Trainer(precision={args['precision']!r}): autotune measures {', '.join(LIGHTNING.values())}; "
            "pass one of them in your trainer_kwargs"
        )
    return own


def hf_fields(cfg: TrialConfig, args: Any) -> dict[str, Any]:
    """The TrainingArguments fields it sets."""
    return {"bf16": cfg.precision == "bf16", "fp16": cfg.precision == "fp16"}


def hf_own(args: Any) -> str:
    """The user's own, from their TrainingArguments."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def hf_precision(cfg: TrialConfig) -> list[str]:
    return [f"    {field}={value!r}," for field, value in hf_fields(cfg, None).items()]


def accelerate_conf(cfg: TrialConfig) -> dict[str, object]:
    return {"mixed_precision": ACCELERATE[cfg.precision]}
