"""A search over the strategy, end to end on CPU: `parallel: [ddp, fsdp]` on the sized language model, every
trial 2 gloo processes (the machine is told it has 2 devices), best.yaml and every export format naming
the winner's strategy. And the bad input: fsdp on a pipeline without blocks stops the search, one line,
before anything is written."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from autotune.apply.export import render
from autotune.core.config import TrialConfig
from autotune.core.configfile import Export
from autotune.core.errors import SearchSpaceError
from autotune.core.settings import SearchSettings
from autotune.search.store.records import TrialRecord
from autotune.search.loop.session import SearchSession
from autotune.search.space.memory import MEMORY_PROBE_ENV
from autotune.search.space.machine import Hardware

LM = "autotune.pipelines.examples.language_model:make_w64_d2"
# The baseline runs 2 processes too (DDP, the user's today): every config compared is a 2-process one.
BASE = TrialConfig(
    pipeline=LM, image_size=32, batch_size=4, warmup_steps=1, timed_steps=3, window=1, baseline={"gpus": 2}
)
TWO_DEVICES = Hardware(cuda=False, gpu_count=2, cpu_count=2, apex=False, memory_bytes=16 * 2**30)
# What names each strategy in each format (a 2-process CPU study).
NAMED = {
    "fsdp": {
        "yaml": "parallel: fsdp",
        "accelerate": "distributed_type: FSDP",
        "hf": "fsdp=True,",
        "lightning": "ModelParallelStrategy(data_parallel_size=2",
    },
    "ddp": {
        "yaml": "parallel: ddp",
        "accelerate": "distributed_type: MULTI_CPU",
        "hf": "--nproc-per-node 2",
        "lightning": "strategy='ddp'",
    },
}


@pytest.fixture
def two_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Hardware, "detect", classmethod(lambda cls: TWO_DEVICES))


def settings(tmp_path: Path, space: str, base: TrialConfig = BASE, **kw: object) -> SearchSettings:
    (tmp_path / "space.yaml").write_text(space)
    return SearchSettings(
        storage=str(tmp_path / "studies.db"),
        space=str(tmp_path / "space.yaml"),
        studies_dir=str(tmp_path / "studies"),
        base=base,
        **kw,
    )  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.usefixtures("two_devices")
def test_a_search_over_ddp_and_fsdp_exports_the_winners_strategy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MEMORY_PROBE_ENV, "1")  # the estimate before launch, beside the peak after
    s = settings(
        tmp_path,
        "knobs:\n  gpus: 2\n  parallel: [ddp, fsdp]\n",
        n_trials=4,
        confirm_rounds=0,
        parity_steps=0,
        sampler="random",
        seed=3,
    )
    session = SearchSession.create(s, warm=False, say=lambda line: None)
    session.run()
    done = [TrialRecord.from_frozen(t) for t in session.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    by = {r.config["parallel"]: r for r in done}
    assert set(by) == {"ddp", "fsdp"}, [r.config for r in done]
    assert by["fsdp"].applied["fsdp"]["dtensor_params"] > 0  # really sharded, not DDP under another name
    assert by["ddp"].applied["parallel"]["in_effect"] == "ddp"
    assert by["fsdp"].memory_estimate["strategy"].startswith("fsdp x2"), by["fsdp"].memory_estimate
    assert by["ddp"].memory_estimate["strategy"] == "ddp x2", by["ddp"].memory_estimate
    # the sharded rank holds half the fp32 state DDP's holds: its estimate's params are smaller
    assert by["fsdp"].memory_estimate["optimizer"] * 2 == pytest.approx(
        by["ddp"].memory_estimate["optimizer"], rel=0.01
    )
    best = yaml.safe_load((tmp_path / "studies" / "autotune" / "best.yaml").read_text())
    strategy = best["config"]["parallel"]
    assert best["config"]["gpus"] == 2 and strategy in ("ddp", "fsdp")
    assert best["metrics"]["memory_estimate"]["peak_bytes"] > 0 and "error" in best["metrics"]["memory_estimate"]
    export = Export(config=TrialConfig.from_dict(best), environment={"device": "cpu"})
    for fmt, marker in NAMED[strategy].items():
        assert marker in render(fmt, export), fmt


@pytest.mark.usefixtures("two_devices")
def test_fsdp_on_a_pipeline_without_blocks_stops_the_search_before_anything_is_written(tmp_path: Path) -> None:
    base = TrialConfig(pipeline="tests.fault_pipelines:no_blocks", image_size=32)
    s = settings(tmp_path, "knobs:\n  gpus: 2\n  parallel: fsdp\n", base=base, n_trials=1)
    with pytest.raises(SearchSpaceError, match="knob 'parallel': fsdp: fsdp shards per block") as e:
        SearchSession.create(s, warm=False, say=lambda line: None)
    assert "\n" not in str(e.value)
    # No study, no file: the studies folder's write probe (search/storage.check_writable) leaves it empty.
    assert not (tmp_path / "studies.db").exists() and not [p for p in (tmp_path / "studies").rglob("*")]
