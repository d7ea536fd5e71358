"""autotune/trial/measurement/clock.py: the one clock every kind of job's loop and every probe drives, read on
a fake GPU and a fake time, so each figure is known exactly: warm-up and the drain of batches made ahead, a
sync before every read and before each fetch, the data wait, windows and progress.jsonl, when a trial is
finished (agreed over ranks), the peak memory of the timed steps, the losses and the result; a probe's
Span (its own warm-up and window, no meters), the samples delivered in the timed steps, and the window
being over, said by the clock."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError
from autotune.trial.measurement import clock as clock_module
from autotune.trial.measurement import measure
from autotune.trial.measurement.clock import Clock, NonFiniteLoss, Span, WindowOver
from tests.fakes import UUID_A, FakeGpu, FakeNvml

GPU = torch.device("cuda", 0)


class FakeTime:
    """time.perf_counter and time.time, moved only by the test; every device sync is logged in `events`."""

    def __init__(self) -> None:
        self.t = 100.0
        self.events: list[str] = []

    def perf_counter(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t

    def advance(self, seconds: float, what: str = "") -> None:
        self.t += seconds
        if what:
            self.events.append(what)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    """A GPU (torch.cuda faked: this machine has none) whose peak is 7 MiB once reset, and a fake clock."""
    t = FakeTime()
    peak = {"reserved": 99 * 2**20}

    def reset(device: object = None) -> None:
        peak["reserved"] = 7 * 2**20

    monkeypatch.setattr(clock_module, "time", t)
    monkeypatch.setattr(measure, "time", t)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: t.events.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: peak["reserved"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(UUID_A)], init_fails=True))
    return t


def cfg(**changes: Any) -> TrialConfig:
    return TrialConfig(batch_size=4, warmup_steps=1, timed_steps=4, window=2).replace(**changes)


def loader(workers: int, prefetch: int | None) -> Any:
    return types.SimpleNamespace(num_workers=workers, prefetch_factor=prefetch)


def step(clock: Clock, t: FakeTime, wait: float, compute: float, loss: float = 1.0) -> bool:
    """One step as a driver runs it: to the loader (`wait` s blocked on it), then `compute` s of kernels."""
    clock.fetching()
    t.advance(wait, "fetch")
    clock.fetched()
    t.advance(compute)
    return clock.step_end(loss)


def run(clock: Clock, t: FakeTime, wait: float = 0.25, compute: float = 0.75) -> int:
    """Steps until the clock says it has measured enough; how many were run."""
    clock.begin()
    n = 1
    while not step(clock, t, wait, compute, loss=1.0 / n):
        n += 1
    clock.close(losses_per_rank=False)
    return n


def test_a_trial_on_the_clock_measures_what_its_steps_took(fake: FakeTime, tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    clock = Clock(cfg(), GPU, 0, 1, progress, launched=fake.t - 3.0)
    assert run(clock, fake) == 1 + 4  # one warm-up step, four timed
    r = clock.result({"x": 1}, memory_total=80)
    assert r.startup_s == 3.0 and r.warmup_s == 1.0 and r.timed_steps == 4
    assert r.step_time_p50 == r.step_time_p90 == 1.0  # the fetch and the compute, end to end
    assert r.data_wait_fraction == 0.25  # the time blocked on the loader, inside each step
    assert r.samples_per_s == 4.0 and r.windows == (4.0, 4.0)  # 2 steps x 4 samples a window of 2 s
    assert [json.loads(x) for x in progress.read_text().splitlines()] == [
        {"step": 2, "samples_per_s": 4.0, "seconds": 2.0},
        {"step": 4, "samples_per_s": 4.0, "seconds": 2.0},
    ]
    assert r.losses == (1.0, 0.5, 1 / 3, 0.25, 0.2) and r.loss_first == 1.0  # warm-up's loss included
    assert r.peak_memory_bytes == 7 * 2**20  # reset when the timed steps began: not the warm-up's peak
    assert r.device == "Fake GPU" and r.world_size == 1 and r.applied == {"x": 1} and r.memory_total_bytes == 80
    assert r.gpu_util is None and r.gpu_util_error == "NVML unavailable"


def test_the_device_is_synced_before_each_fetch_and_each_read(fake: FakeTime) -> None:
    """Kernels run asynchronously: without a sync before the fetch, the previous micro-batch's kernels
    would be counted as a wait on the loader."""
    clock = Clock(cfg(warmup_steps=0, timed_steps=1), GPU, 0, 1, None, launched=fake.t)
    clock.begin()
    fake.events.clear()
    step(clock, fake, wait=0.1, compute=0.2)
    assert fake.events[:2] == ["sync", "fetch"]  # synced before the loader is asked
    assert fake.events[2:].count("sync") >= 1  # and before the step's end is read


def test_micro_batches_wait_on_the_loader_from_a_sync_each(fake: FakeTime) -> None:
    clock = Clock(cfg(warmup_steps=0, timed_steps=1, window=1), GPU, 0, 1, None, launched=fake.t)
    clock.begin()
    for _ in range(2):  # two micro-batches, 0.1 s of waiting and 0.4 s of compute each
        clock.fetching()
        fake.advance(0.1, "fetch")
        clock.fetched()
        fake.advance(0.4)
    assert clock.step_end(1.0)
    clock.close(losses_per_rank=False)
    r = clock.result({}, None)
    assert r.data_wait_fraction == pytest.approx(0.2) and r.step_time_p50 == pytest.approx(1.0)


def test_a_time_boxed_trial_runs_a_window_at_least_then_its_seconds(fake: FakeTime) -> None:
    clock = Clock(cfg(warmup_steps=0, seconds=3.5, window=2), GPU, 0, 1, None, launched=fake.t)
    assert run(clock, fake) == 4  # 1 s a step: 3 s is short of 3.5, the 4th step passes it
    clock = Clock(cfg(warmup_steps=0, seconds=0.1, window=2), GPU, 0, 1, None, launched=fake.t)
    assert run(clock, fake) == 2  # the seconds are spent after one step, but a window takes two


@pytest.mark.parametrize(
    "changes, loaders, warm",
    [
        ({}, [loader(2, 2)], 1 + 4),  # the 2 workers x prefetch 2 batches made ahead: 4 more steps
        ({"batch_size": 2, "global_batch": 4}, [loader(2, 2)], 1 + 2),  # 2 batches a step
        ({}, [loader(2, 2), loader(1, 3)], 1 + 7),  # every loader the job iterates
        ({}, [loader(0, None)], 1),  # nothing made ahead
        ({"warmup_steps": 0}, [loader(2, 2)], 0),  # parity's runs: a loss for exactly their steps
    ],
)
def test_the_warm_up_drains_the_batches_the_loaders_made_ahead(
    fake: FakeTime, changes: dict[str, Any], loaders: list[Any], warm: int
) -> None:
    c = cfg(**changes)
    clock = Clock(c, GPU, 0, 1, None, launched=fake.t)
    for each in loaders:
        clock.loader(each)
        clock.loader(each)  # a new epoch's iterator over the same loader: counted once
    assert run(clock, fake) == warm + 4 and clock.untimed_steps == warm
    r = clock.result({}, None)
    assert r.timed_steps == 4 and r.warmup_s == warm * 1.0 and len(r.losses) == warm + 4
    if loaders == [loader(2, 2)] and not changes:
        assert c.replace(num_workers=2, prefetch_factor=2).untimed_steps == warm  # what a Trainer must run


def test_the_drain_says_why_on_rank_0(fake: FakeTime, capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (0, 1):
        clock = Clock(cfg(), GPU, rank, 2, None, launched=fake.t)
        clock.loader(loader(2, 2))
        clock.begin()
        while clock.warming:
            step(clock, fake, 0.0, 1.0)
    err = capsys.readouterr().err
    assert err.count("autotune trial:") == 1  # rank 0's only
    assert "4 more warm-up step(s): the loader keeps 4 batches made ahead (2 workers x prefetch 2)" in err


def test_a_loader_told_after_the_warm_up_changes_nothing(fake: FakeTime) -> None:
    clock = Clock(cfg(), GPU, 0, 1, None, launched=fake.t)
    clock.begin()
    step(clock, fake, 0.0, 1.0)
    assert not clock.warming
    clock.loader(loader(2, 2))  # a validation loader, say, started during the timed steps
    assert clock.untimed_steps == 1 and not clock.warming


def test_a_non_finite_loss_stops_the_trial(fake: FakeTime) -> None:
    clock = Clock(cfg(), GPU, 0, 1, None, launched=fake.t)
    clock.begin()
    with pytest.raises(NonFiniteLoss, match="nan"):
        clock.step_end(math.nan)
    with pytest.raises(NonFiniteLoss, match="inf"):
        clock.loss(math.inf)  # handed over after the step (HF logs it then)


def test_a_loop_that_ends_before_a_timed_step_has_no_result(fake: FakeTime) -> None:
    clock = Clock(cfg(warmup_steps=3), GPU, 0, 1, None, launched=fake.t)
    clock.begin()
    step(clock, fake, 0.0, 1.0)
    clock.close(losses_per_rank=False)
    with pytest.raises(ConfigError, match="ended after 1 optimizer step"):
        clock.result({}, None)


def test_a_window_nvml_never_sampled_says_why_it_has_no_utilisation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(UUID_A)]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def no_uuid(device: object = None) -> object:
        raise AssertionError("Torch not compiled with CUDA enabled")  # the index maps it to NVML's GPU 0

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_uuid)
    with measure.GpuUtilSampler(GPU, interval_s=60.0) as util:  # the window ends before the first read
        pass
    assert util.mean is None and util.first_error is None  # silent, as a trial of a few short steps was
    clock_module._say_why_no_util(util, GPU, 0.04)
    assert util.first_error == (
        "no utilisation sample: the timed steps took 0.04 s, less than NVML's 0.1 s sampling interval "
        "(time more steps or seconds)"
    )
    cpu = measure.GpuUtilSampler(torch.device("cpu"))
    clock_module._say_why_no_util(cpu, torch.device("cpu"), 0.04)
    assert cpu.first_error is None  # a CPU has no utilisation to miss


# --- a probe's Span ---------------------------------------------------------------------------------


def test_a_span_times_its_steps_after_its_warm_up_and_only_counts_and_times(
    fake: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe's clock: its warm-up untimed, its steps timed, and nothing of the trial's meters (no reset
    of the peak, which would empty CUDA's cache under a script run as written; no NVML sampler)."""
    monkeypatch.setattr(measure, "reset_peak_memory", lambda device: fake.events.append("reset"))
    clock = Clock(Span(warmup=2, steps=3, meters=False), GPU)
    clock.begin()
    for _ in range(2):  # the warm-up: slow steps the window must not see
        assert not step(clock, fake, wait=1.0, compute=9.0)
    assert not clock.warming and clock.seconds is None
    done = [step(clock, fake, wait=0.25, compute=0.75) for _ in range(3)]
    assert done == [False, False, True] and clock.over
    assert clock.seconds == 3.0 and clock.timed_steps == 3 and clock.waited_s == 0.75
    assert clock.util is None and "reset" not in fake.events and "sync" in fake.events
    r = clock.result({}, None)
    assert r.peak_memory_bytes == 0 and r.gpu_util is None and r.windows == ()  # no meters, no windows
    metered = Clock(Span(warmup=0, steps=1), GPU)  # meters on: the same span resets the peak, as a trial does
    run(metered, fake)
    assert "reset" in fake.events and metered.util is not None


def test_a_span_with_seconds_runs_its_steps_at_least_then_its_seconds(fake: FakeTime) -> None:
    clock = Clock(Span(warmup=0, steps=2, seconds=3.5), GPU)
    assert run(clock, fake) == 4  # 1 s a step: the 4th passes 3.5 s
    clock = Clock(Span(warmup=0, steps=3, seconds=0.1), GPU)
    assert run(clock, fake) == 3  # the seconds are spent after one step, the steps are not
    assert Span.of(cfg(seconds=2.0, window=2)) == Span(1, 2, 2.0, every=2, meters=True)
    assert Span.of(cfg()) == Span(1, 4, None, every=2, meters=True)  # a trial's: its timed steps


def test_the_clock_says_when_the_window_is_over_and_raises_through_a_loop_it_does_not_own(fake: FakeTime) -> None:
    clock = Clock(Span(warmup=1, steps=2, meters=False), GPU)
    clock.begin()
    ended_at = 0
    with pytest.raises(WindowOver):
        for n in range(1, 100):  # a script's loop, the clock driven from a hook inside it
            try:
                ended_at = n
                step(clock, fake, 0.0, 1.0)
                clock.raise_if_over()
            except Exception:  # noqa: BLE001 - a script's own handler: WindowOver is no Exception
                pass
    assert ended_at == 3 and clock.over  # one warm-up step, two timed


def test_the_samples_counted_are_the_timed_steps_delivered_batches(fake: FakeTime) -> None:
    clock = Clock(Span(warmup=1, steps=2, meters=False), GPU)
    assert clock.samples is None  # no batch told: the job's batches come from no loader the driver sees
    clock.delivered(torch.zeros(100, 3))  # before the job is ready to step: no step's
    clock.begin()
    for batches in ([torch.zeros(8, 3)], [torch.zeros(5, 3), torch.zeros(5, 3)], [{"x": (torch.zeros(3, 2),)}]):
        for b in batches:  # the warm-up's 8, then 5 + 5 (two micro-batches), then 3 from a nested batch
            clock.delivered(b)
        clock.step_end()
    assert clock.over and clock.samples == 10 + 3
    clock = Clock(Span(warmup=0, steps=1, meters=False), GPU)
    clock.begin()
    clock.delivered([])  # a batch with no tensor counts as one sample, and says a loader delivered
    clock.step_end()
    assert clock.samples == 1


# --- over ranks: two gloo ranks, forked ------------------------------------------------------------


def _fork_ranks(target: Any, tmp_path: Path, *args: Any) -> list[int]:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # the child inherits this process's torch: no second import
    ranks = [ctx.Process(target=target, args=(r, str(tmp_path), *args)) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=60)
    for p in ranks:
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in ranks]


def _rank_steps(rank: int, folder: str) -> None:
    """One of two CPU ranks, time-boxed at 2 s: rank 0's steps take 1 s, rank 1's 0.1 s (a fake clock each)."""
    import torch.distributed as dist

    t = FakeTime()
    clock_module.time = t  # type: ignore[assignment]  # a forked child's own module
    measure.time = t  # type: ignore[assignment]
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    try:
        clock = Clock(cfg(warmup_steps=0, seconds=2.0, window=1), torch.device("cpu"), rank, 2, None, t.t)
        clock.begin()
        n = 0
        while True:
            n += 1
            if step(clock, t, 0.0, (1.0, 0.1)[rank], loss=float(rank)):
                break
        clock.close(losses_per_rank=True)
        r = clock.result({}, None)
        Path(folder, str(rank)).write_text(json.dumps({"steps": n, "samples_per_s": r.samples_per_s, "loss": r.losses}))
    finally:
        dist.destroy_process_group()


def test_ranks_agree_when_the_trial_is_finished_and_the_slowest_time_counts(tmp_path: Path) -> None:
    """A rank that stopped alone would leave the others waiting in their next all-reduce."""
    assert _fork_ranks(_rank_steps, tmp_path) == [0, 0]
    got = [json.loads((tmp_path / str(r)).read_text()) for r in range(2)]
    assert [g["steps"] for g in got] == [2, 2]  # rank 0's 2 s decide; rank 1 alone would run 20 steps
    # Both ranks' samples over the slowest rank's time, on both: 2 steps x 4 samples x 2 ranks in 2 s.
    assert [g["samples_per_s"] for g in got] == [pytest.approx(8.0)] * 2
    assert [g["loss"] for g in got] == [[0.5, 0.5]] * 2  # each step's loss, the mean of the ranks' shards


def _rank_peak(rank: int, folder: str, uuids: tuple[str, ...] | None) -> None:
    """One of two gloo ranks on 'cuda:0' (torch.cuda faked: this machine has no GPU), peaks 100 and 200."""
    import torch.distributed as dist

    def props(device: object = None) -> types.SimpleNamespace:
        if uuids is None:
            raise AssertionError("Torch not compiled with CUDA enabled")  # no UUID: host and index decide
        return types.SimpleNamespace(uuid=uuids[rank])

    torch.cuda.get_device_properties = props  # type: ignore[assignment]  # a forked child's own torch
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    try:
        peak = clock_module._device_peak(GPU, (100, 200)[rank])
    finally:
        dist.destroy_process_group()
    Path(folder, str(rank)).write_text(str(peak))


@pytest.mark.parametrize(
    "uuids, peaks",
    [
        (("58b2e1b9-a", "58b2e1b9-a"), [300, 300]),  # one GPU, two allocators: it holds both
        (("58b2e1b9-a", "7a6b5c4d-b"), [100, 200]),  # each rank its own GPU (both see it as cuda:0)
        (None, [300, 300]),  # no UUID from torch: one host, one index
    ],
)
def test_ranks_on_one_gpu_add_their_peaks(tmp_path: Path, uuids: tuple[str, ...] | None, peaks: list[int]) -> None:
    assert _fork_ranks(_rank_peak, tmp_path, uuids) == [0, 0]
    assert [int((tmp_path / str(r)).read_text()) for r in range(2)] == peaks


def test_a_run_that_carries_a_check_records_its_losses_on_untimed_past_the_window(fake: FakeTime) -> None:
    """record_steps (search/checks/riding.py): the window times what it always did; the run goes on, untimed, until
    the losses a class's check reads are in, and only then is it over."""
    clock = Clock(cfg(record_steps=8), GPU)
    clock.begin()
    n, over_at = 0, []
    while not step(clock, fake, 0.25, 0.75 if n < 5 else 9.0, loss=1.0 / (n + 1)):  # untimed steps: slow, unseen
        n += 1
        over_at.append(clock.over)
    clock.close(losses_per_rank=False)
    r = clock.result({}, memory_total=None)
    assert n + 1 == 8 and not any(over_at) and clock.over  # over once the 8th loss is in, not at the window's end
    assert r.timed_steps == 4 and r.samples_per_s == 4.0 and r.step_time_p90 == 1.0  # the window is unchanged
    assert len(r.losses) == 8
    assert r.record_s == pytest.approx(3 * (0.25 + 9.0))  # what carrying the check cost: the 3 steps past the window
    # A run that has them when its window closes stops there, and carrying them cost nothing.
    again = Clock(cfg(record_steps=3), GPU)
    assert run(again, fake) == 1 + 4
    again.close(losses_per_rank=False)
    assert again.result({}, memory_total=None).record_s == 0.0
