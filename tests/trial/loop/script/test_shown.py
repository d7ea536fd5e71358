"""What the run shows decides: a script whose DataLoader and optimizer are built by factories (in a package
beside it, or in an installed library, the loader a subclass there), whose model is a task wrapper, and whose
`init_process_group` sits under a flag it was not given. Its source is a first guess (no DataLoader, no
optimizer known, its own process group); trial 0's record (TrialConfig.shown) decides what it takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.core.settings import SearchSettings
from autotune.pipelines import base_config, load_pipeline, script
from autotune.search.loop import trial0
from autotune.search.space.reading import load_space
from autotune.search.space.resolve import resolve, shown_of
from autotune.search.space.spec import DEFAULT_SPACE
from autotune.trial.loop import worker
from autotune.trial.processes import launcher

FACTORY = Path(__file__).parent / "scripts" / "factory"
LIB = FACTORY.parent / "factory_lib"
LOADER_KNOBS = {"num_workers", "pin_memory", "prefetch_factor", "persistent_workers"}
SHORT = {"warmup_steps": 1, "timed_steps": 3, "window": 1}  # num_threads kept: a baseline runs as written


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch, repo_on_path: Path) -> Path:
    """The installed library on the path, in this process and in the trials' (as pip would put it)."""
    monkeypatch.setenv("PYTHONPATH", f"{LIB}:{repo_on_path}")
    monkeypatch.syspath_prepend(str(LIB))
    return LIB


def run(args: list[str], **knobs: Any) -> Any:
    cfg = TrialConfig(pipeline=script.spec_of(str(FACTORY / "train.py"), args), **{**SHORT, **knobs})
    return worker.run(cfg)


@pytest.mark.parametrize("lib", ["beside", "installed"])
def test_trial_0_shows_the_loader_and_optimizer_a_factory_built(lib: str, library: Path) -> None:
    args = ["--lib", lib, "-j", "1", "--pin-mem"]
    spec = script.spec_of(str(FACTORY / "train.py"), args)
    guess = script.load(TrialConfig(pipeline=spec))
    # The source names no DataLoader (a factory builds it, `tud.` or a library's subclass) and no optimizer.
    assert LOADER_KNOBS <= guess.unsupported and "batch_size" in guess.unsupported
    assert guess.lr_rule == "sqrt" and "no optimizer autotune knows" in guess.lr_rule_why
    r = run(args)
    assert r.status == "ok", r.message
    shown = shown_of(r.applied)
    assert shown == {"loaders": 1, "optimizers": ("SGD",), "own_group": False, "seeded": True}
    # The run's loader ran the script's own -j 1 with pinning: recorded as it ran, not "no DataLoader".
    (loader,) = r.applied["script"]["loaders"]
    assert loader == {
        "batch_size": 8, "num_workers": 1, "pin_memory": True, "prefetch_factor": 2, "persistent_workers": False,
        "sampler": "RandomSampler",
    }  # fmt: skip
    assert r.applied["num_workers"]["in_effect"] == 1 and r.applied["pin_memory"]["in_effect"] is True
    # Seeded by the library's helper: reproducible, so parity can check it (the source's guess: not so).
    assert script.not_checkable(TrialConfig(pipeline=spec)) is not None
    assert script.not_checkable(TrialConfig(pipeline=spec, shown=tuple(shown.items()))) is None
    job = script.load(TrialConfig(pipeline=spec, shown=tuple(shown.items()), baseline={"batch_size": 8}))
    assert not (LOADER_KNOBS | {"batch_size", "gpus"}) & job.unsupported
    assert job.lr_rule == "linear" and "SGD" in job.lr_rule_why  # the optimizer that stepped
    # Handed the knobs through the same seams, wherever the loader was built.
    cfg = {"shown": tuple(shown.items()), "baseline": {"batch_size": 8, "num_workers": 1, "pin_memory": True}}
    r = run(args, num_workers=2, pin_memory=False, batch_size=16, **cfg)
    assert r.status == "ok", r.message
    assert r.applied["num_workers"]["in_effect"] == 2 and r.applied["pin_memory"]["in_effect"] is False
    assert r.applied["batch_size"]["in_effect"] == 16 and r.applied["script"]["samples_per_step"] == 16


def test_a_standalone_trial_lets_the_run_decide_what_the_source_guessed(library: Path) -> None:
    """No study, no trial 0: `autotune trial` with a loader knob on a script whose source names no DataLoader
    runs it where the run builds one (one that builds none is refused: test_running.py)."""
    r = run(["--lib", "installed"], num_workers=1)
    assert r.status == "ok" and r.applied["num_workers"]["in_effect"] == 1


def test_the_search_follows_what_trial_0_showed(library: Path, tmp_path: Path) -> None:
    args = ["--lib", "installed", "-j", "1"]
    spec = script.spec_of(str(FACTORY / "train.py"), args)
    base = base_config(spec, None, None, str(tmp_path))
    assert base.lr_scaling == "sqrt" and base.shown is None
    settings = SearchSettings(storage=str(tmp_path / "studies.db"), studies_dir=str(tmp_path), base=base)
    space, _, _ = resolve(load_space(DEFAULT_SPACE), load_pipeline(base), settings, base, lambda line: None)
    assert "num_workers" not in space.searched() and "batch_size" not in space.searched()  # the source's guess
    r = worker.run(base.replace(**SHORT))
    said: list[str] = []
    learned = trial0.script_lessons(settings, space, r.applied, said.append)
    assert learned is not None
    after, searched = learned
    assert {"num_workers", "batch_size"} <= set(searched.searched()), said
    assert dict(after.base.shown or ()) == {"loaders": 1, "optimizers": ("SGD",), "own_group": False, "seeded": True}
    # The baseline is what the script ran: its own -j 1, its batch 8, read from the run.
    assert dict(after.base.baseline or ()) == {"batch_size": 8, "num_workers": 1, "prefetch_factor": 2}
    assert after.base.lr_scaling == "linear"  # SGD stepped: its rule, not the default guess
    line = next(s for s in said if s.startswith("space: trial 0's run showed"))
    assert "1 DataLoader(s) built; optimizer SGD stepped; no process group" in line
    assert "num_workers" in line and "lr rule sqrt -> linear" in line


def test_a_task_wrapper_s_inner_blocks_are_checkpointed_and_channels_last(library: Path) -> None:
    """A task wrapper (the model and its loss in one module) whose `to` takes no memory format, as timm's."""
    r = run(["--lib", "installed"], checkpoint_segments=2, channels_last=True)
    assert r.status == "ok", r.message
    assert r.applied["script"]["model"]["model"] == "Task" and r.applied["script"]["model"]["repeated_blocks"] == 3
    assert r.applied["observed"]["model_checkpointed_blocks"] == 2
    assert r.applied["channels_last"]["in_effect"] is True


@pytest.mark.slow
@pytest.mark.side_by_side
def test_a_group_its_flags_leave_off_is_set_up_by_the_trial_on_two_ranks(library: Path, tmp_path: Path) -> None:
    """`init_process_group` under `if args.distributed:`, a flag not given: the run sets up no group, so the
    trial does: one model trained on 2 gloo ranks (equal parameters after each step), sharded, the global
    batch 2x and the lr for it (SGD: linear)."""
    record = tmp_path / "record"
    record.mkdir()
    args = ["--lib", "installed", "--record", str(record)]
    spec = script.spec_of(str(FACTORY / "train.py"), args)
    guess = script.load(TrialConfig(pipeline=spec))
    assert guess.uses.process_group  # the source's guess: it sets up its own
    shown = (("loaders", 1), ("optimizers", ("SGD",)), ("own_group", False))
    cfg = TrialConfig(
        pipeline=spec, gpus=2, batch_size=8, shown=shown, baseline={"batch_size": 8}, lr=0.01, lr_scaling="linear",
        **SHORT,
    )  # fmt: skip
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    assert r.status == "ok", r.message
    a, seen = r.applied, r.applied["observed"]
    assert seen["world_size"] == 2 and seen["model_replicated"] is True and seen["sharded_loaders"] == 1
    assert a["script"]["process_group"] == "trial" and a["gpus"]["in_effect"] == 2
    assert seen["global_batch"] == 16 and a["global_batch"]["in_effect"] == 16
    assert a["lr"]["in_effect"] == pytest.approx(0.02)  # 0.01 for 8, x2 by the linear rule for 16
    ranks = [json.loads((record / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] >= 2 and ranks[0]["batch"] == 8
    assert ranks[0]["params"] == pytest.approx(ranks[1]["params"], rel=1e-9)  # one model, not two


@pytest.mark.slow
@pytest.mark.side_by_side
def test_a_group_the_script_sets_up_is_its_own_on_two_ranks(library: Path, tmp_path: Path) -> None:
    """The same script given --distributed: its own group and DDP are kept (the trial replicates nothing)."""
    spec = script.spec_of(str(FACTORY / "train.py"), ["--lib", "installed", "--distributed"])
    cfg = TrialConfig(pipeline=spec, gpus=2, **SHORT)
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    assert r.status == "ok", r.message
    assert r.applied["script"]["process_group"] == "own" and r.applied["observed"]["model_replicated"] is False
    assert r.applied["observed"]["world_size"] == 2


CONFIGURED = Path(__file__).parent / "scripts" / "configured" / "no_loader.py"


def test_a_batch_its_configurator_sets_is_what_its_model_was_fed(tmp_path: Path) -> None:
    """nanoGPT's `--batch_size=12`, no DataLoader: the run records the 12 sequences its model was fed each
    step (x its 2 micro-batches), never autotune's placeholder 8, and the study's baseline is rebased on it."""
    spec = script.spec_of(str(CONFIGURED), ["--batch_size=12", "--gradient_accumulation_steps=2"])
    base = base_config(spec, None, None, str(tmp_path))
    r = worker.run(base.replace(**SHORT))
    assert r.status == "ok", r.message
    a = r.applied
    assert a["batch_size"]["in_effect"] == 12 and "what its model was fed" in a["batch_size"]["why"]
    assert a["script"]["own"]["batch_size"] == 12 and a["script"]["own"]["accumulation"] == 2
    assert a["script"]["samples_per_step"] == 24 and a["global_batch"]["in_effect"] == 24
    assert a["throughput"]["unit"] == "samples/s"
    settings = SearchSettings(storage=str(tmp_path / "studies.db"), studies_dir=str(tmp_path), base=base)
    space, _, _ = resolve(load_space(DEFAULT_SPACE), load_pipeline(base), settings, base, lambda line: None)
    said: list[str] = []
    learned = trial0.script_lessons(settings, space, a, said.append)
    assert learned is not None and dict(learned[0].base.baseline or ())["batch_size"] == 12, said
    assert learned[0].base.own_accumulation == 2
    assert "batch_size" in learned[1].searched(), said  # through its own option, from here


def test_the_diff_writes_a_library_loader_s_knobs_through_the_script_s_own_options(
    library: Path, tmp_path: Path
) -> None:
    """The diff cannot edit a library: it writes each knob where the script's call into it passes one (its
    `-b` and `-j`: the options' defaults), and says the rest (`autotune run` applies them)."""
    from autotune.apply.export.diff import to_diff
    from autotune.core.configfile import Export

    shown = (("loaders", 1), ("optimizers", ("SGD",)), ("own_group", False), ("seeded", True))
    spec = script.spec_of(str(FACTORY / "train.py"), ["--lib", "installed"])
    cfg = TrialConfig(
        pipeline=spec, shown=shown, baseline={"batch_size": 8}, num_workers=1, batch_size=16, persistent_workers=True,
        **SHORT,
    )  # fmt: skip
    r = worker.run(cfg)
    assert r.status == "ok", r.message
    sites = r.applied["script"]["sites"]
    (loader,) = sites["loaders"]
    assert loader["file"].startswith(str(LIB)) and loader["type"] == "FastLoader"
    assert loader["via"]["file"] == str(FACTORY / "train.py")  # the script's own create_loader(...) call
    diff = to_diff(Export(cfg, sites=sites), device="cpu", cwd=str(FACTORY))
    body = [line for line in diff.splitlines() if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
    assert '+parser.add_argument("-b", "--batch-size", type=int, default=16)' in body, diff
    assert '+parser.add_argument("-j", "--workers", type=int, default=1)' in body, diff
    assert not any(line.startswith("+++") and "fastdata" in line for line in diff.splitlines())  # not edited
    note = next(line for line in diff.splitlines() if "built in a library" in line)
    assert "persistent_workers=True" in note and "`autotune run` applies" in note


@pytest.mark.slow
@pytest.mark.side_by_side
def test_torchrun_autotune_run_trains_one_model_where_the_flags_leave_the_group_off(
    library: Path, tmp_path: Path
) -> None:
    """`torchrun -m autotune run` on the script whose `init_process_group` its flags leave off: the run sets up
    the group, as the trial did: one model, equal parameters on both ranks after each step."""
    import os
    import subprocess
    import sys

    from autotune.core.configfile import Export, to_yaml

    record = tmp_path / "record"
    record.mkdir()
    args = ["--lib", "installed", "--steps", "8", "--record", str(record)]
    shown = (("loaders", 1), ("optimizers", ("SGD",)), ("own_group", False), ("seeded", True))
    spec = script.spec_of(str(FACTORY / "train.py"), args)
    cfg = TrialConfig(pipeline=spec, gpus=2, shown=shown, baseline={"batch_size": 8}, **SHORT)
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(Export(cfg)))
    out = tmp_path / "applied.json"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "autotune", "run", "--config", str(config), "--out", str(out), str(FACTORY / "train.py"), *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    applied = json.loads(out.read_text())["applied"]
    assert applied["script"]["process_group"] == "trial" and applied["observed"]["model_replicated"] is True
    ranks = [json.loads((record / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 7
    assert ranks[0]["params"] == pytest.approx(ranks[1]["params"], rel=1e-9)


def test_a_configurator_batch_option_hands_the_trial_s_batch_over(tmp_path: Path) -> None:
    """Once trial 0 showed that `--batch_size=12` is what its model is fed, batch_size is searched through that
    option (no edit): a trial at 16 gives `--batch_size=16`, its model is fed 16, and the lr follows the rule."""
    args = ["--batch_size=12", "--gradient_accumulation_steps=2"]
    spec = script.spec_of(str(CONFIGURED), args)
    guess = script.load(TrialConfig(pipeline=spec))
    assert "batch_size" in guess.unsupported  # before a run: no DataLoader, no at.batch_size()
    base = base_config(spec, None, None, str(tmp_path)).replace(baseline={"batch_size": 12}, own_accumulation=2)
    job = script.load(base)
    assert "batch_size" not in job.unsupported and job.own == (12, 2) and job.batch_option == "--batch_size="
    r = worker.run(base.replace(batch_size=16, **SHORT))
    assert r.status == "ok", r.message
    a = r.applied
    assert a["batch_size"]["in_effect"] == 16 and "--batch_size=16" in a["batch_size"]["why"]
    assert a["script"]["samples_per_step"] == 32 and a["global_batch"]["in_effect"] == 32
    assert a["lr"]["in_effect"] == pytest.approx(base.lr * (32 / 24) ** 0.5)  # AdamW: sqrt


def test_an_option_that_does_not_move_the_batch_fails_the_trial(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    source = CONFIGURED.read_text().replace(
        "torch.manual_seed(1337)", "batch_size = 12  # set again, after its options\n"
    )
    path.write_text(
        source.replace('os.path.dirname(__file__), "configurator.py"', f'"{CONFIGURED.parent}", "configurator.py"')
    )
    base = base_config(script.spec_of(str(path), ["--batch_size=12"]), None, None, str(tmp_path))
    with pytest.raises(TrialUnsupported, match="that option does not set the batch it trains on"):
        worker.run(base.replace(baseline={"batch_size": 12}, batch_size=16, **SHORT))


# ---- the record of what the run showed (trial/loop/script/shown.py), read by records.py -----------------


def test_the_run_s_own_batch_is_read_from_its_loaders_else_from_what_its_model_was_fed() -> None:
    from autotune.pipelines.script import api
    from autotune.trial.loop.script import records as batch
    from autotune.trial.loop.script.shown import Shown

    trial = api.Trial(device_type="cpu")
    # Loaders: 24 samples in 3 batches per optimizer step (an epoch's short last step aside).
    loaders = Shown(step_samples=(24, 24, 24, 10), step_batches=(3, 3, 3, 2))
    assert batch.own_as_run(trial, loaders) == {
        "batch_size": 8,
        "accumulation": 3,
        "from": "its loaders: 24 sample(s) in 3 batch(es) per optimizer step",
    }
    assert batch.throughput(trial, loaders)["unit"] == "samples/s"
    # No loader: the batch its model was fed, x its backward passes per step.
    fed = Shown(step_samples=(0, 0), step_batches=(0, 0), step_backwards=(2, 2), fed=5)
    own = batch.own_as_run(trial, fed)
    assert own is not None and (own["batch_size"], own["accumulation"]) == (5, 2)
    assert batch.batch_seen(fed, trial, None)["batch_size"][0] == 5
    # Nothing counted, nothing fed, nothing handed over: unknown, and the figure is in steps.
    nothing = Shown()
    assert batch.own_as_run(trial, nothing) is None
    assert batch.batch_seen(nothing, trial, None)["batch_size"] == (None, batch.UNSEEN)
    assert batch.throughput(trial, nothing)["unit"] == "steps/s"
