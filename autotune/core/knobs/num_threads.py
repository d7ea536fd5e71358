"""num_threads: `torch.set_num_threads`, the intra-op threads a CPU op runs on (0 = torch's default). Speed
only.

A call the process takes before the job runs; under torchrun, 0 means the ranks' equal share of the cores
this process may use (trial/loop/knobs/num_threads.py), not torchrun's one thread a rank.

- Its space rules: clipped to the CPUs this process may use (affinity, the cgroup quota).
- An unedited script: set before it runs; a line of its own that sets it runs after and wins (the record reads
  the count after the run; the diff says so).
- The exports: `torch.set_num_threads(N)` where the target has no field for it (the diff adds it where the
  script calls it nowhere: apply/export/_compute.py).

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.core.knobs.row import IN_SCRIPT, Clip, Machine, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "num_threads"
ROW = knob(0, "`torch.set_num_threads` (0 = torch's default)")
NOTHING = "0 = torch's default; nothing to set"


def machine(hw: Machine) -> list[Rule]:
    return [Clip(hw.cpu_count, f"{hw.cpu_count} CPUs")]


def _line(cfg: TrialConfig, comment: str = "") -> list[str]:
    return [f"torch.set_num_threads({cfg.num_threads!r}){comment}"] if cfg.num_threads else []


def row(cfg: TrialConfig, target: str) -> str:
    if not cfg.num_threads:
        return NOTHING
    if target == "lightning":
        return "torch.set_num_threads (see below)"
    if target == "hf":
        return "not a TrainingArguments field: torch.set_num_threads (below)"
    return f"{IN_SCRIPT}, torch.set_num_threads({cfg.num_threads})"


def lightning_extra(cfg: TrialConfig) -> list[str]:
    return _line(cfg, "  # num_threads, before building the DataLoader")


def framework_notes(cfg: TrialConfig, target: str) -> list[str]:
    return _line(cfg, "  # num_threads, at the start of your script")


def hf_notes(cfg: TrialConfig) -> list[str]:
    return _line(cfg, "  # num_threads")


def accelerate_code(cfg: TrialConfig) -> list[str]:
    return _line(cfg)


def script_lines(cfg: TrialConfig) -> list[str]:
    return _line(cfg)
