"""`export --format script` of a script study (--pipeline script:PATH ...): what to change in that script.

The no-edit knobs are written as the lines they become in the script (the DataLoader's arguments, the
optimizer's flag, zero_grad, cudnn, threads): a trial overrode all of them, so all are listed. The
cooperative knobs are the plain torch calls the at.* lines stand for, for a run without autotune. A best
whose knobs are the baseline's is the script as it is: "no change". best.yaml (`--format yaml`) is what
`autotune trial --config best.yaml` re-measures.
"""

from __future__ import annotations

import shlex

from autotune.apply.export import _compute, _loader, _step
from autotune.core.configfile import Export
from autotune.core.errors import AutotuneError
from autotune.pipelines import kind_of, script


def renders(e: Export) -> bool:
    return "script" in kind_of(e.config.pipeline).exports


def to_script(e: Export, device: str | None = None) -> str:
    cfg = e.config
    if not renders(e):
        raise AutotuneError(f"--format script needs a script study (--pipeline script:...), not {cfg.pipeline!r}")
    path, args = script.parse(cfg.pipeline)
    head = [f"# autotune export for {path}", f"# its arguments: {shlex.join(args) or '(none)'}"]
    if cfg.is_baseline:
        return "\n".join([*head, "# no change: the fastest configuration measured is the script as written", ""])
    if e.speedup is not None:
        head.append(f"# measured speedup over the script as written: x{e.speedup:.2f}")
    try:
        skip: frozenset[str] = script.load(cfg).unsupported
    except AutotuneError:  # the script is not on this machine: every knob is listed
        skip = frozenset()
    lines = [*head, "# re-measure it: autotune trial --config best.yaml", "", "# no edit: set these in the script"]
    lines += [*_loader.script_lines(cfg, skip), *_step.script_lines(cfg), *_compute.script_lines(cfg)]
    cooperative = _compute.api_lines(cfg, skip, "cpu" if device in (None, "cpu") else "cuda")
    if cooperative:
        lines += [
            "",
            "# through autotune.script: a trial sets them; without autotune, write the torch call",
            *cooperative,
        ]
    return "\n".join(lines) + "\n"
