"""The session sizes configs before launch: micro-batches no strategy fits are dropped from the space
(and said), a proposal whose estimate exceeds the usable memory is written off unrun (and named), the
baseline is measured whatever its estimate, and a real search records the estimate beside the peak."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.apply.report import memory_rows
from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.space import memory
from autotune.search.loop.admission import Sizer
from autotune.search.space.memory import ModelFacts
from autotune.search.store.records import StudyRecord, TrialRecord
from autotune.search.store.results import feasible
from autotune.search.loop.session import SearchSession
from autotune.search.space.memory import MEMORY_PROBE_ENV
from autotune.search.space.machine import Hardware
from autotune.search.space.spec import SearchSpace
from autotune.trial.probes.model_facts import ProbeError

TINY = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, warmup_steps=1, timed_steps=3, window=1)
MiB = 2**20
# 1 MiB of state (params + grads + AdamW: 4 x 64k floats) and 1 MiB saved per sample, on a CPU.
FACTS = ModelFacts(
    param_count=65536, largest_block_params=0, blocks_param_count=0, activation_bytes_per_sample=MiB, device="cpu"
)


def settings(tmp_path: Path, space: str, **kw: Any) -> SearchSettings:
    path = tmp_path / "space.yaml"
    path.write_text(space)
    base = dict(
        budget_s=300.0,
        storage=str(tmp_path / "studies.db"),
        space=str(path),
        studies_dir=str(tmp_path / "studies"),
        base=TINY,
        parity_steps=0,
        confirm_rounds=0,
        memory_headroom=0.0,
    )
    return SearchSettings(**{**base, **kw})


@pytest.fixture
def small_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU with 12 MiB of RAM and no bf16 (so the warm start stays fp32), and FACTS as the probe's answer
    (no probe process)."""
    monkeypatch.setenv(MEMORY_PROBE_ENV, "1")
    monkeypatch.setattr(
        Hardware,
        "detect",
        classmethod(
            lambda cls: Hardware(
                cuda=False, gpu_count=0, cpu_count=2, apex=False, cpu_bf16=False, memory_bytes=12 * MiB
            )
        ),
    )
    monkeypatch.setattr(memory, "run_probe", lambda cfg, folder, timeout_s: FACTS.to_dict())
    # The machine is pretend, the trials' RSS real (hundreds of MiB): no calibrating the one by the other.
    monkeypatch.setattr(Sizer, "calibrate", lambda self, frozen: None)


def test_micro_batches_that_cannot_fit_are_dropped_before_the_study_and_said(
    tmp_path: Path, small_machine: None
) -> None:
    said: list[str] = []
    s = settings(tmp_path, "knobs:\n  batch_size: [4, 8, 16, 32]\n")
    session = SearchSession.create(s, warm=False, say=said.append)
    # 1 MiB + 16 MiB and 1 MiB + 32 MiB: more than 12 MiB under any strategy (one process is the only one)
    assert [line for line in said if "dropped" in line] == [
        f"space: batch_size: dropped {b} (batch {b}: estimated {gib} GiB per rank even under one process, "
        "> 0.01 GiB usable)"
        for b, gib in ((16, "0.02"), (32, "0.03"))
    ]
    stored = SearchSpace.from_dict(StudyRecord.of(session.study).space or {})
    assert list(stored["batch_size"].values) == [4, 8]  # type: ignore[union-attr]
    assert StudyRecord.of(session.study).model_facts == FACTS.to_dict()


def test_without_the_probe_nothing_is_sized(
    tmp_path: Path, small_machine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MEMORY_PROBE_ENV, "0")
    session = SearchSession.create(settings(tmp_path, "knobs:\n  batch_size: [4, 64]\n"), warm=False, say=print)
    assert session.sizer.fit is None and StudyRecord.of(session.study).model_facts is None


@pytest.mark.slow
def test_a_proposal_too_big_is_written_off_unrun_and_the_baseline_still_runs(
    tmp_path: Path, small_machine: None
) -> None:
    said: list[str] = []
    # 7 MiB usable: batch 8 (9 MiB) does not fit, batch 4 (5 MiB) does; 8 is the baseline's, so it stays.
    s = settings(
        tmp_path,
        "knobs:\n  batch_size: [4, 8]\n  num_workers: [0, 2]\n",
        n_trials=2,
        sampler="random",
        seed=0,
        memory_headroom=5 / 12,
    )
    session = SearchSession.create(s, warm=False, say=said.append)
    session.run()
    trials = session.study.get_trials(deepcopy=False)
    records = [TrialRecord.from_frozen(t) for t in trials]
    assert (records[0].role, records[0].config["batch_size"], records[0].reason) == ("baseline", 8, None)
    assert any(
        line.startswith("autotune: the baseline may not fit (batch 8 under one process: estimated") for line in said
    )  # measured whatever its estimate, and said
    assert (records[1].role, records[1].config["batch_size"], records[1].reason) == ("warm_start", 8, "memory_estimate")
    assert records[1].message == "batch 8 under one process: estimated 0.01 GiB per rank > 0.01 GiB usable; skipped"
    assert trials[1].state == optuna.trial.TrialState.COMPLETE and not feasible(trials[1])
    assert records[1].memory_estimate is not None and records[1].memory_estimate["total"] == MiB + 8 * MiB
    launched = [r for t, r in zip(trials, records) if (Path(s.studies_dir) / s.study / f"trial-{t.number}").exists()]
    assert 1 not in [t.number for t, r in zip(trials, records) if r in launched]  # the warm start never ran
    assert {(r.role, r.config["batch_size"]) for r in launched} <= {("baseline", 8), ("search", 4)}
    ran = [r for r in launched if r.role == "search"]
    assert all(r.memory_estimate and r.memory_estimate["total"] == MiB + 4 * MiB for r in ran)


@pytest.mark.slow
def test_a_real_cpu_search_records_the_estimate_beside_the_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo_on_path: Path
) -> None:
    monkeypatch.setenv(MEMORY_PROBE_ENV, "1")
    said: list[str] = []
    s = settings(tmp_path, "knobs:\n  batch_size: [4, 8]\n", n_trials=3, memory_headroom=0.1)
    session = SearchSession.create(s, warm=True, say=said.append)  # trials forked from the warm server
    outcome = session.run()
    facts = StudyRecord.of(session.study).model_facts
    assert facts is not None and facts["param_count"] == 3 * 8 * 9 + 8 + 8 + 1  # the tiny pipeline's two convs
    # The first trial measured sets the process's own share of a CPU's peak (a fork holds less than the
    # probe's cold start); every estimate after it is within a tenth of the peak.
    assert any(line.startswith("memory: the trial process itself holds") for line in said), said
    run = [
        t
        for t in session.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if TrialRecord.from_frozen(t).repeat_of is None
    ]  # not a contended trial's re-run left waiting
    for t in run:
        record = TrialRecord.from_frozen(t)
        assert record.memory_estimate is not None and record.metrics["peak_memory_bytes"]
    for t in run[1:]:
        estimate, peak = (
            TrialRecord.from_frozen(t).memory_estimate,
            TrialRecord.from_frozen(t).metrics["peak_memory_bytes"],
        )
        assert abs(estimate["total"] - peak) / peak < 0.1, (t.number, estimate, peak)  # type: ignore[index]
    best = yaml.safe_load(outcome.best_yaml.read_text())  # type: ignore[union-attr]
    mem = best["metrics"]["memory_estimate"]
    assert mem["peak_bytes"] == best["metrics"]["peak_memory_bytes"]
    assert mem["error"] == pytest.approx((mem["total_bytes"] - mem["peak_bytes"]) / mem["peak_bytes"], abs=1e-4)
    rows = memory_rows(session.study)
    assert len(rows) == len(run) and all(r[6].endswith("%") for r in rows)


def test_a_worker_sizes_configs_with_the_facts_its_study_stored(
    tmp_path: Path, small_machine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings(tmp_path, "knobs:\n  batch_size: [4, 8]\n")
    SearchSession.create(s, warm=False, say=print)
    monkeypatch.setattr(memory, "run_probe", lambda *a: pytest.fail("a worker must not probe again"))
    worker = SearchSession.join(s, None, warm=False, say=print)
    assert worker.sizer.fit is not None and worker.sizer.fit.facts == FACTS and not worker.sizer.fit.cuda
    assert worker.sizer.fit.usable == memory.memory_bytes(False)  # this machine's RAM, --memory-headroom 0


def test_a_model_that_cannot_be_probed_is_said_and_the_search_goes_on(
    tmp_path: Path, small_machine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*a: Any) -> dict[str, Any]:
        raise ProbeError("exited with code 1: RuntimeError: boom")

    monkeypatch.setattr(memory, "run_probe", refuse)
    said: list[str] = []
    session = SearchSession.create(settings(tmp_path, "knobs:\n  batch_size: [4, 64]\n"), warm=False, say=said.append)
    assert session.sizer.fit is None
    assert any(
        line.startswith("memory: no estimate, the model could not be probed (exited with code 1") for line in said
    )
    assert not (tmp_path / "studies").exists() or not list((tmp_path / "studies").rglob("probe"))


@pytest.mark.parametrize("backend, per_gpu", [("gloo", 2), ("nccl", 1)])
def test_ranks_sharing_the_one_gpu_are_sized_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, per_gpu: int
) -> None:
    """AUTOTUNE_DDP_BACKEND=gloo puts rank r on GPU r mod count: on one GPU, 2 ranks' memory on it."""
    from autotune.trial.loop.knobs import DDP_BACKEND_ENV

    monkeypatch.setenv(MEMORY_PROBE_ENV, "1")
    monkeypatch.setenv(DDP_BACKEND_ENV, backend)
    on_gpu = ModelFacts(**{**FACTS.to_dict(), "device": "cuda"})
    monkeypatch.setattr(memory, "run_probe", lambda cfg, folder, timeout_s: on_gpu.to_dict())
    hw = Hardware(cuda=True, gpu_count=1, cpu_count=2, apex=False, memory_bytes=80 * 2**30)
    fit = memory.probe_fit(settings(tmp_path, "knobs: {}\n"), TINY, hw, print)
    assert fit is not None and fit.per_device(2) == per_gpu
    # A worker joining the study sizes alike: the GPUs its fingerprint counts, the same backend.
    monkeypatch.setattr(memory, "memory_bytes", lambda cuda: 80 * 2**30 if cuda else None)
    record = StudyRecord(fingerprint={"gpu_count": 1}, model_facts=on_gpu.to_dict())
    joined = memory.stored_fit(record, 0.1)
    assert joined is not None and joined.cuda and joined.per_device(2) == per_gpu


def test_a_proposal_records_how_many_ranks_share_its_gpu(tmp_path: Path) -> None:
    on_gpu = ModelFacts(**{**FACTS.to_dict(), "device": "cuda"})
    sizer = Sizer(memory.Fit(on_gpu, 80 * 2**30, cuda=True, devices=1, shared=True), print)
    study = optuna.create_study()
    trial = study.ask()
    sizer.record(trial, TINY.replace(gpus=2), "search")
    assert sizer.too_big(TINY.replace(gpus=2)) is None
    estimate = TrialRecord.of(trial).memory_estimate
    assert estimate is not None and estimate["ranks_per_gpu"] == 2  # type: ignore[typeddict-item]
    assert estimate["total"] == memory.estimate(TINY.replace(gpus=2), on_gpu).total  # one rank's parts
