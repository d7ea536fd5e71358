"""What a config must fit in: the model facts, probed once (trial/probe.py, in a process of its own) or
read back from a study's record, against this machine's memory. The arithmetic is memory.py's; writing
off a proposal that cannot fit is the loop's (search/loop/admission.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any


from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.space import memory
from autotune.search.space.hardware import Hardware, memory_bytes
from autotune.trial.probe import ProbeError, run_probe

if TYPE_CHECKING:  # the record is read by its fields; space/ sits below the study store
    from autotune.search.store.records import StudyRecord

MEMORY_PROBE_ENV = "AUTOTUNE_MEMORY_PROBE"  # "0": no probe, no estimate
PROBE_TIMEOUT_S = 300.0


def probe_fit(
    settings: SearchSettings, base: TrialConfig, hw: Hardware, say: Callable[[str], Any]
) -> memory.Fit | None:
    """Measure the model facts once (trial/probe.py, a process of its own) and what a config must fit in:
    the device's memory (RAM on a CPU) less the headroom. None, said, when either is unknown."""
    if os.environ.get(MEMORY_PROBE_ENV, "1") == "0":
        return None
    if hw.memory_bytes is None:
        say("memory: the device's memory is unknown, so configs are not sized before launch")
        return None
    try:  # in a folder of its own that goes with it: nothing is written before the study is opened
        with tempfile.TemporaryDirectory(prefix="autotune-probe-") as folder:
            facts = run_probe(base, Path(folder), PROBE_TIMEOUT_S)
    except ProbeError as e:
        say(f"memory: no estimate, the model could not be probed ({e}); configs are not sized before launch")
        return None
    return memory.Fit(
        memory.ModelFacts.from_dict(facts),
        int(hw.memory_bytes * (1 - settings.memory_headroom)),
        hw.cuda,
        gpus=hw.gpu_count,
        shared=_ranks_share_gpus(),
    )


def stored_fit(record: StudyRecord, headroom: float) -> memory.Fit | None:
    """A worker's Fit: the facts its study stored, against this machine's memory and GPU count (same
    fingerprint)."""
    if not record.model_facts or os.environ.get(MEMORY_PROBE_ENV, "1") == "0":
        return None
    facts = memory.ModelFacts.from_dict(record.model_facts)
    cuda = facts.device == "cuda"
    total = memory_bytes(cuda)
    if not total:
        return None
    gpus = int((record.fingerprint or {}).get("gpu_count") or 0)
    return memory.Fit(facts, int(total * (1 - headroom)), cuda, gpus=gpus, shared=_ranks_share_gpus())


def _ranks_share_gpus() -> bool:
    from autotune.trial.knobs import ranks_share_gpus  # imports torch: only once a search sizes configs

    return ranks_share_gpus()
