"""A memory estimate per rank before launch: arithmetic on a few model facts, no torch.

The facts (ModelFacts) are measured once per study by trial/probes/model_facts.py in its own process: the parameter
count, the largest block's (FSDP's unit of all-gather), and the bytes autograd saves per sample for one
fp32 forward without checkpointing, in all and per checkpointable stage. From them, for any config:

    params + grads + optimizer state + activations at the micro-batch (+ the process's own RSS on CPU)

Every approximation is stated where it is made. The estimate is recorded with each trial beside the
measured peak, so its error is visible (apply/report.py); the session skips configs it says cannot fit
(`narrow` before the study, `too_big` per proposal).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.pipelines import kind_of
from autotune.search.space.machine import Hardware, memory_bytes
from autotune.trial.probes.model_facts import ProbeError, run_probe

if TYPE_CHECKING:  # the record is read by its fields; space/ sits below the study store
    from autotune.search.store.records import StudyRecord

FP32, HALF = 4, 2  # bytes per element
GiB = 2**30
# FSDP2 all-gathers the next block while the current one computes (forward and backward prefetch).
UNSHARDED_BLOCKS = 2
STAGE_FIGURES = ("stage_activation_bytes", "stage_input_bytes", "stage_before_bytes")


@dataclass(frozen=True)
class ModelFacts:
    """What trial/probes/model_facts.py measured once per study (its JSON, field for field)."""

    param_count: int
    largest_block_params: int  # the largest of the pipeline's `blocks` (else stages; else the whole model)
    blocks_param_count: int  # all blocks together; the rest is the root's, unsharded throughout under FSDP
    activation_bytes_per_sample: float  # saved for backward, fp32, no checkpointing, parameters excluded
    # Per checkpointable stage, in order, per sample: bytes saved inside it, the bytes of its input (what
    # a checkpointed stage keeps instead), and bytes saved before it began. Empty: no stages declared.
    stage_activation_bytes: tuple[float, ...] = ()
    stage_input_bytes: tuple[float, ...] = ()
    stage_before_bytes: tuple[float, ...] = ()
    runtime_bytes: int = 0  # the probe's RSS less its parameters: torch, the pipeline, its data (CPU only)
    device: str = "cpu"  # where the probe ran: cuda | cpu
    batch: int = 2  # the micro-batch it measured at

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in STAGE_FIGURES:
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelFacts:
        names = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in names}
        for k in STAGE_FIGURES:
            kw[k] = tuple(kw.get(k) or ())
        return cls(**kw)


@dataclass(frozen=True)
class MemoryEstimate:
    """A config's memory per rank before launch, in bytes, by what holds them."""

    params: int
    grads: int
    optimizer: int
    activations: int
    runtime: int = 0  # the process itself (CPU only: CUDA's peak reserved memory does not count the context)
    strategy: str = ""
    total: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", self.params + self.grads + self.optimizer + self.activations + self.runtime)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def strategy(cfg: TrialConfig) -> str:
    """How the model is spread over the ranks, in words: 'one process', 'ddp x2', 'fsdp x4 (bf16 params, ...)'."""
    if cfg.gpus == 1:
        return "one process"
    if cfg.parallel != "fsdp":
        return f"ddp x{cfg.gpus}"
    flags = [
        f
        for f, on in (
            ("no reshard", not cfg.fsdp_reshard),
            ("bf16 params", cfg.fsdp_param_dtype == "bf16"),
            ("offload", cfg.fsdp_offload),
        )
        if on
    ]
    return f"fsdp x{cfg.gpus}" + (f" ({', '.join(flags)})" if flags else "")


def estimate(cfg: TrialConfig, facts: ModelFacts) -> MemoryEstimate:
    """Bytes per rank for `cfg`. Approximations:
    - Parameters and their gradients are fp32 (autocast computes in half precision, but the weights
      and their grads stay fp32); AdamW keeps 2 fp32 tensors per parameter (exp_avg, exp_avg_sq).
    - The parts are summed into the peak, though gradients fill while activations are freed in
      backward: with set_to_none=True that overstates the backward peak by up to the gradients. Optimizer temporaries (foreach's
      intermediates) come after the activations are freed and are left out; so are the transient
      gradients of activations, cuDNN workspaces and the caching allocator's fragmentation (the
      measured CUDA peak is *reserved* memory, which that fragmentation inflates)."""
    p = facts.param_count
    world = cfg.gpus
    fsdp = world > 1 and cfg.parallel == "fsdp"
    if fsdp:
        params, grads, optimizer = _fsdp_states(cfg, facts)
    else:
        params, grads, optimizer = p * FP32, p * FP32, 2 * p * FP32
        if world > 1:
            grads += p * FP32  # DDP's gradient buckets are a second copy (gradient_as_bucket_view=False)
    # The CUDA peak is the caching allocator's: the process itself (CUDA context, libraries) is outside it.
    runtime = facts.runtime_bytes if facts.device == "cpu" else 0
    return MemoryEstimate(
        int(params), int(grads), int(optimizer), int(activations(cfg, facts)), int(runtime), strategy(cfg)
    )


def _fsdp_states(cfg: TrialConfig, facts: ModelFacts) -> tuple[float, float, float]:
    """(params, grads, optimizer state) bytes per rank under FSDP2. Sharded fp32 state is 1/world of the
    whole (shards are taken as equal); unsharded copies are in the param dtype: with reshard_after_forward,
    the root's own parameters (outside every block) plus UNSHARDED_BLOCKS of the largest block (the one
    computing and the one prefetched); without it, the whole model stays gathered from forward to backward.
    Gradients: the sharded fp32 ones, plus one block's and the root's unsharded ones before reduce-scatter.
    Offload (on CUDA): the sharded parameters, gradients and optimizer state live in host memory."""
    p, world = facts.param_count, cfg.gpus
    compute = HALF if cfg.fsdp_param_dtype == "bf16" else FP32
    root = max(0, p - facts.blocks_param_count)
    block = facts.largest_block_params
    gathered = root + min(UNSHARDED_BLOCKS * block, facts.blocks_param_count) if cfg.fsdp_reshard else p
    on_device = not (cfg.fsdp_offload and facts.device == "cuda")
    sharded = p * FP32 / world if on_device else 0.0
    return sharded + gathered * compute, sharded + (root + block) * compute, 2 * sharded


def activations(cfg: TrialConfig, facts: ModelFacts) -> float:
    """Saved activations at the micro-batch. Approximations:
    - Linear in the micro-batch (cfg.batch_size per rank): the probe measured a small one and divided.
    - Half precision (autocast fp16/bf16, or FSDP's bf16 compute parameters) halves them; in truth
      less than half, since norms and losses keep fp32 copies.
    - k checkpointed stages (the first k, as trial/loop/knobs/checkpoint_segments.py wraps them) keep only
      their inputs. Their insides come back one stage at a time in backward, when everything saved after
      that stage is freed: the peak is the larger of the end of forward and the worst stage's recomputation."""
    per_sample = _checkpointed(facts, cfg.checkpoint_segments)
    half = cfg.precision != "fp32" or (cfg.sharded and cfg.fsdp_param_dtype == "bf16")
    return max(0.0, per_sample) * cfg.batch_size * (0.5 if half else 1.0)


def versus_peak(estimate: Mapping[str, Any] | None, peak: int | None) -> dict[str, Any] | None:
    """A recorded estimate (Fit.recorded) beside the measured peak: its parts, and its error as a
    fraction of the peak (+: it overstated); None without both. The parts are one rank's; with ranks
    sharing a GPU the peak is the device's, so the error compares it with that many ranks' total."""
    if not estimate or not peak or not estimate.get("total"):
        return None
    parts = {
        f"{k}_bytes": int(estimate[k])
        for k in ("total", "params", "grads", "optimizer", "activations", "runtime")
        if estimate.get(k) is not None
    }
    sharing = int(estimate.get("ranks_per_gpu") or 1)
    return {
        **parts,
        "strategy": estimate.get("strategy", "") + (f", {sharing} ranks per GPU" if sharing > 1 else ""),
        "peak_bytes": int(peak),
        "error": round((int(estimate["total"]) * sharing - peak) / peak, 4),
    }


def _checkpointed(facts: ModelFacts, segments: int) -> float:
    """Peak saved bytes per sample with the first `segments` stages checkpointed (the whole figure at 0)."""
    inside, inputs, before = facts.stage_activation_bytes, facts.stage_input_bytes, facts.stage_before_bytes
    k = min(segments, len(inside), len(inputs), len(before))
    if not k:
        return facts.activation_bytes_per_sample
    kept = [inputs[j] - inside[j] for j in range(k)]  # what checkpointing stage j changes (< 0: saves)
    end_of_forward = facts.activation_bytes_per_sample + sum(kept)
    # Recomputing stage j: what was saved before it (earlier checkpointed stages by their inputs), its
    # input, and its insides again.
    recompute = max(before[j] + sum(kept[:j]) + inputs[j] + inside[j] for j in range(k))
    return max(end_of_forward, recompute)


# ---- fitting: the device's memory less the headroom ------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """What a config must fit in: `usable` bytes per device (one GPU, or a CPU's RAM), and how many of a
    trial's ranks one device holds."""

    facts: ModelFacts
    usable: int  # memory x (1 - --memory-headroom)
    cuda: bool
    devices: int = 0  # GPUs visible here; 0: unknown (each rank then has one of its own)
    shared: bool = False  # ranks may share a GPU (AUTOTUNE_DDP_BACKEND=gloo): rank r takes GPU r mod devices

    def per_device(self, world: int) -> int:
        """The ranks whose memory the fullest device holds: on a CPU all of them (processes sharing one
        RAM); on CUDA one, unless ranks share GPUs, when ceil(world / gpus) land on the first one."""
        if not self.cuda:
            return world
        return -(-world // self.devices) if self.shared and self.devices else 1

    def needed(self, est: MemoryEstimate, world: int) -> int:
        return est.total * self.per_device(world)

    def where(self, world: int) -> str:
        """What `needed` counts, in words: 'per rank', 'for 2 ranks sharing one GPU'."""
        n = self.per_device(world)
        return "per rank" if n == 1 else f"for {n} ranks sharing {'one GPU' if self.cuda else 'the RAM'}"

    def recorded(self, est: MemoryEstimate, world: int) -> dict[str, Any]:
        """The estimate as each trial records it: with ranks sharing a GPU, how many, since the measured
        CUDA peak is then the device's (all of them together; trial/loop/worker.py)."""
        n = self.per_device(world) if self.cuda else 1
        return {**est.to_dict(), **({"ranks_per_gpu": n} if n > 1 else {})}

    def calibrated(self, estimate: Mapping[str, Any], peak: int) -> Fit:
        """This Fit with the process's own share (on a CPU, where the peak is the RSS) taken from a measured
        trial: its peak less the other parts of its estimate (MemoryEstimate.to_dict())."""
        runtime = max(0, peak - (int(estimate["total"]) - int(estimate.get("runtime") or 0)))
        return dataclasses.replace(self, facts=dataclasses.replace(self.facts, runtime_bytes=runtime))

    def too_big(self, cfg: TrialConfig) -> str | None:
        """One line when `cfg`'s estimate exceeds what is usable, else None."""
        est = estimate(cfg, self.facts)
        need = self.needed(est, cfg.gpus)
        if need <= self.usable:
            return None
        return (
            f"batch {cfg.batch_size} under {est.strategy}: estimated {gib(need)} {self.where(cfg.gpus)} > "
            f"{gib(self.usable)} usable; skipped"
        )


def gib(n: float) -> str:
    return f"{n / GiB:.0f} GiB" if n >= 10 * GiB else f"{n / GiB:.2f} GiB"


# ------------------------------------------------------------- the facts, probed or read back

MEMORY_PROBE_ENV = "AUTOTUNE_MEMORY_PROBE"  # "0": no probe, no estimate
PROBE_TIMEOUT_S = 300.0


def probe_fit(settings: SearchSettings, base: TrialConfig, hw: Hardware, say: Callable[[str], Any]) -> Fit | None:
    """Measure the model facts once (trial/probes/model_facts.py, a process of its own) and what a config must fit in:
    the device's memory (RAM on a CPU) less the headroom. None, said, when either is unknown."""
    if os.environ.get(MEMORY_PROBE_ENV, "1") == "0":
        return None
    if hw.memory_bytes is None:
        say("memory: the device's memory is unknown, so configs are not sized before launch")
        return None
    kind = kind_of(base.pipeline)
    if not kind.can_probe_memory:  # its model is built inside its own loop, and its batch is its own
        say(f"memory: {kind.noun} builds its model in its own loop, so configs are not sized before launch")
        return None
    try:  # in a folder of its own that goes with it: nothing is written before the study is opened
        with tempfile.TemporaryDirectory(prefix="autotune-probe-") as folder:
            facts = run_probe(base, Path(folder), PROBE_TIMEOUT_S)
    except ProbeError as e:
        say(f"memory: no estimate, the model could not be probed ({e}); configs are not sized before launch")
        return None
    return Fit(
        ModelFacts.from_dict(facts),
        int(hw.memory_bytes * (1 - settings.memory_headroom)),
        hw.cuda,
        devices=hw.gpu_count,
        shared=_ranks_share_gpus(),
    )


def stored_fit(record: StudyRecord, headroom: float) -> Fit | None:
    """A worker's Fit: the facts its study stored, against this machine's memory and GPU count (same
    fingerprint)."""
    if not record.model_facts or os.environ.get(MEMORY_PROBE_ENV, "1") == "0":
        return None
    facts = ModelFacts.from_dict(record.model_facts)
    cuda = facts.device == "cuda"
    total = memory_bytes(cuda)
    if not total:
        return None
    gpus = int((record.fingerprint or {}).get("gpu_count") or 0)
    return Fit(facts, int(total * (1 - headroom)), cuda, devices=gpus, shared=_ranks_share_gpus())


def _ranks_share_gpus() -> bool:
    from autotune.trial.loop.knobs import ranks_share_gpus  # imports torch: only once a search sizes configs

    return ranks_share_gpus()


__all__ = ["MemoryEstimate", "Fit", "ModelFacts", "estimate", "strategy", "versus_peak"]
