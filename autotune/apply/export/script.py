"""`export --format script` of a script study (--pipeline script:PATH ...): what to change in that script.

The no-edit knobs are written as the lines they become in the script (the DataLoader's arguments, the
optimizer's flag, zero_grad, cudnn, threads): a trial overrode all of them, so all are listed. The
cooperative knobs are the plain torch calls the at.* lines stand for, for a run without autotune. A best
whose knobs are the baseline's is the script as it is: "no change". best.yaml (`--format yaml`) is what
`autotune trial --config best.yaml` re-measures.
"""

from __future__ import annotations

import shlex

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.configfile import Export
from autotune.core.errors import AutotuneError
from autotune.pipelines import script


def renders(e: Export) -> bool:
    return script.is_script(e.config.pipeline)


def to_script(e: Export, device: str | None = None) -> str:
    cfg = e.config
    if not renders(e):
        raise AutotuneError(f"--format script needs a script study (--pipeline script:...), not {cfg.pipeline!r}")
    path, args = script.parse(cfg.pipeline)
    head = [f"# autotune export for {path}", f"# its arguments: {shlex.join(args) or '(none)'}"]
    if cfg.knobs() == baseline_of(cfg).knobs():
        return "\n".join([*head, "# no change: the fastest configuration measured is the script as written", ""])
    if e.speedup is not None:
        head.append(f"# measured speedup over the script as written: x{e.speedup:.2f}")
    try:
        skip: frozenset[str] = script.load(cfg).unsupported
    except AutotuneError:  # the script is not on this machine: every knob is listed
        skip = frozenset()
    lines = [*head, "# re-measure it: autotune trial --config best.yaml", "", "# no edit: set these in the script"]
    lines += no_edit(cfg, skip)
    cooperative = api_lines(cfg, skip, "cpu" if device in (None, "cpu") else "cuda")
    if cooperative:
        lines += [
            "",
            "# through autotune.script: a trial sets them; without autotune, write the torch call",
            *cooperative,
        ]
    return "\n".join(lines) + "\n"


def no_edit(cfg: TrialConfig, skip: frozenset[str]) -> list[str]:
    out = []
    if "num_workers" not in skip:
        kw = f"num_workers={cfg.num_workers}, pin_memory={cfg.pin_memory}"
        if cfg.num_workers:
            kw += f", persistent_workers={cfg.persistent_workers}, prefetch_factor={cfg.prefetch_factor or 2}"
        out.append(f"DataLoader(..., {kw})")
    flag = {"fused": "fused=True", "foreach": "foreach=True", "none": "foreach=False, fused=False"}
    if cfg.optimizer_fusion in flag:
        out.append(
            f"torch.optim.YourOptimizer(..., {flag[cfg.optimizer_fusion]})  # optimizer_fusion={cfg.optimizer_fusion}"
        )
    out.append(f"optimizer.zero_grad(set_to_none={cfg.set_to_none})")
    out.append(f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark}")
    if cfg.num_threads:
        out.append(f"torch.set_num_threads({cfg.num_threads})")
    return out


def api_lines(cfg: TrialConfig, skip: frozenset[str], device: str) -> list[str]:
    out = []
    if "precision" not in skip and cfg.precision != "fp32":
        dtype = "torch.bfloat16" if cfg.precision == "bf16" else "torch.float16"
        out.append(f"with at.autocast():  # precision={cfg.precision}: torch.autocast({device!r}, dtype={dtype})")
        if cfg.precision == "fp16":
            out.append(f"scaler = at.scaler()  # torch.amp.GradScaler({device!r})")
    if "channels_last" not in skip and cfg.channels_last:
        out.append("model = at.model(model)  # channels_last: model.to(memory_format=torch.channels_last)")
    if "compile" not in skip and cfg.compile != "off":
        out.append(f"model = at.model(model)  # compile: torch.compile(model, mode={cfg.compile!r})")
    return out
