"""The model facts a memory estimate needs, measured once per study in a process of its own.

`python -m autotune.trial.probes.model_facts --config cfg.json --out facts.json` builds the pipeline's model, counts
its parameters (in all, in its largest block, in all blocks), and runs one fp32 forward and loss at a
small micro-batch under `torch.autograd.graph.saved_tensors_hooks`, which sees exactly the tensors
autograd keeps for backward, on CPU or GPU. A tensor is counted once by its storage (views and a
tensor saved by two ops share one), parameters and buffers not at all (they are counted as
parameters, or do not grow with the batch). search/space/memory.py turns the facts into an estimate.

It runs in its own process so that the search process stays light (no model in it) and a model that
does not fit takes down only the probe. `run_probe` starts it and reads its JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from autotune.core.config import TrialConfig
from autotune.core.configfile import load_config
from autotune.core.errors import TrialTimeout
from autotune.core.procs import die_with_parent
from autotune.pipelines import load_pipeline, stages_of
from autotune.trial.loop.outcome import entry_main

PROBE_BATCH = 2  # small enough to fit wherever a trial could, large enough to divide out per-sample figures


class ProbeError(Exception):
    """The probe could not measure the model (its log's tail in the message)."""


def run_probe(cfg: TrialConfig, folder: Path, timeout_s: float) -> dict[str, Any]:
    """Measure `cfg`'s pipeline in a fresh process; its facts (memory.ModelFacts' fields) or ProbeError."""
    from autotune.trial.processes.launcher import EntryFailed, run_entry  # lazy: psutil; `--help` imports this module

    try:
        return run_entry("autotune.trial.probes.model_facts", cfg, folder, "facts.json", timeout_s)
    except TrialTimeout:
        raise ProbeError(f"no result after {timeout_s:.0f} s") from None
    except EntryFailed as e:
        raise ProbeError(str(e)) from None


def measure(cfg: TrialConfig, batch: int = PROBE_BATCH) -> dict[str, Any]:
    """The facts of `cfg`'s pipeline, measured in this process."""
    import resource

    import torch
    from torch.utils.data import default_collate

    from autotune.trial.loop import harness  # noqa: F401 - lazy: torch; what a trial imports, so the runtime counts it

    torch.manual_seed(cfg.seed)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    pipeline = load_pipeline(cfg)
    model = pipeline.build_model()
    dataset = pipeline.build_dataset()
    params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    blocks = tuple(getattr(pipeline, "blocks", None) or stages_of(pipeline))
    sizes = [sum(p.numel() for p in model.get_submodule(name).parameters()) for name in blocks]
    model = model.to(device).train()
    batch = max(1, min(batch, len(dataset)))  # type: ignore[arg-type]
    x, y = (t.to(device) for t in default_collate([dataset[i] for i in range(batch)]))
    stages = stages_of(pipeline)
    saved = SavedBytes(model, stages)
    with saved:
        loss = pipeline.loss(model(x), y)
    # One training step, so that the process's peak RSS holds what a trial's does (backward's buffers,
    # AdamW's state); the runtime is that peak less what the estimate counts itself: the weights, their
    # grads, AdamW's 2 tensors each and the saved activations. Only a CPU's peak counts the process.
    loss.backward()
    torch.optim.AdamW(model.parameters(), foreach=False).step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    runtime = peak - 4 * param_bytes - saved.total
    return {
        "param_count": params,
        "largest_block_params": max(sizes, default=0),
        "blocks_param_count": min(params, sum(sizes)),
        "activation_bytes_per_sample": saved.total / batch,
        "stage_activation_bytes": [b / batch for b in saved.inside],
        "stage_input_bytes": [b / batch for b in saved.inputs],
        "stage_before_bytes": [b / batch for b in saved.before],
        "runtime_bytes": max(0, runtime),
        "device": device.type,
        "batch": batch,
    }


class SavedBytes:
    """Within `with`: the bytes of every tensor autograd saves (each storage once; parameters and buffers
    never), in all and inside each of `stages` (dotted submodule names), the bytes of each stage's
    inputs (what a checkpointed stage keeps instead of its insides), and those saved before it began."""

    def __init__(self, model: Any, stages: tuple[str, ...] = ()) -> None:
        import torch

        self.model, self.stages = model, stages
        self.total = 0
        self.inside = [0] * len(stages)
        self.inputs = [0] * len(stages)
        self.before = [0] * len(stages)  # bytes saved before the stage was entered (forward order)
        self._seen = {_storage(t) for t in (*model.parameters(), *model.buffers())}
        self._active: list[int] = []  # stages entered and not yet left (innermost last)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._handles: list[Any] = []

    def __enter__(self) -> SavedBytes:
        for i, name in enumerate(self.stages):
            module = self.model.get_submodule(name)
            self._handles.append(module.register_forward_pre_hook(lambda m, args, i=i: self._enter(i, args)))
            self._handles.append(module.register_forward_hook(lambda m, args, out, i=i: self._leave(i)))
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()

    def _enter(self, i: int, args: Any) -> None:
        import torch

        self._active.append(i)
        self.before[i] = self.total
        self.inputs[i] += sum(t.numel() * t.element_size() for t in args if isinstance(t, torch.Tensor))

    def _leave(self, i: int) -> None:
        if i in self._active:
            self._active.remove(i)

    def _pack(self, t: Any) -> Any:
        key = _storage(t)
        if key not in self._seen:
            self._seen.add(key)
            n = _nbytes(t)
            self.total += n
            if self._active:
                self.inside[self._active[-1]] += n
        return t


def _storage(t: Any) -> tuple[str, int]:
    try:
        return str(t.device), t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor subclass without a plain storage: by identity
        return "id", id(t)


def _nbytes(t: Any) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autotune.trial.probes.model_facts",
        description="Measure a pipeline's model facts for the memory estimate.",
    )
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--batch", type=int, default=PROBE_BATCH)
    args = parser.parse_args(argv)
    die_with_parent()
    return entry_main("probe", lambda: measure(load_config(args.config), args.batch), args.out)


if __name__ == "__main__":
    sys.exit(main())
