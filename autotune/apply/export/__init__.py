"""Best trial -> a file a user can apply: autotune's own YAML, or Lightning / HF / accelerate settings.

The native YAML is the round-trippable record (`autotune.core.configfile`). A study of a framework
pipeline (--pipeline lightning:... / hf:...) exports, in its own format, the user's Trainer arguments as
its winning trial passed them (`framework.py`). The framework renderings are one-way, one module each:
each lists every tuned knob, either as a field the framework has or as a comment saying where it goes,
so nothing the search found is dropped silently. A script study (--pipeline script:...) exports what to
change in that script: the lines (`script.py`), or a unified diff against it to apply with patch (`diff.py`);
the diff applied to a copy of the script is what the search's alone rounds run (`patched.py`).
"""

from __future__ import annotations

from collections.abc import Callable

from autotune.apply.export import framework
from autotune.apply.export.accelerate import to_accelerate
from autotune.apply.export.diff import to_diff
from autotune.apply.export.hf import to_hf
from autotune.apply.export.lightning import to_lightning
from autotune.apply.export.script import to_script
from autotune.core.configfile import Export, to_yaml
from autotune.core.errors import ConfigError

FORMATS = ("yaml", "lightning", "hf", "accelerate", "script", "diff")

__all__ = ["FORMATS", "Export", "render", "to_accelerate", "to_diff", "to_hf", "to_lightning", "to_yaml"]


def render(fmt: str, e: Export) -> str:
    """Render an Export in one of FORMATS; the device it was measured on picks accelerator/use_cpu."""
    device = e.environment.get("device")
    device = device if isinstance(device, str) else None
    renderers: dict[str, Callable[[], str]] = {
        "yaml": lambda: to_yaml(e),
        "lightning": lambda: to_lightning(e.config, device=device),
        "hf": lambda: to_hf(e.config, device=device),
        "accelerate": lambda: to_accelerate(e.config, device=device),
        "script": lambda: to_script(e, device=device),
        "diff": lambda: to_diff(e, device=device),
    }
    if fmt not in renderers:
        raise ConfigError(f"unknown export format {fmt!r}; choose one of {'|'.join(FORMATS)}")
    if framework.renders(fmt, e):  # a Lightning or HF study: the user's own Trainer arguments, tuned
        return framework.render(e)
    return renderers[fmt]()
