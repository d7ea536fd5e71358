"""autotune/pipelines/examples: the example pipelines satisfy the protocol, learn, and tune end to end
(trial, search, export, reproduce) through `--pipeline`, as does a pipeline defined outside the package.
A factory that cannot be imported or returns the wrong thing is bad input: exit 2, saying what was expected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from autotune.trial.loop import harness, knobs
from autotune.trial.loop.knobs import checkpoint_segments
from autotune.cli import main
from autotune.core.config import KNOBS, TrialConfig
from autotune.pipelines import Pipeline, load_pipeline, stages_of, unsupported_of
from autotune.pipelines.examples import classifier, language_model
from tests.conftest import REPO_ROOT

CLASSIFIER = "autotune.pipelines.examples.classifier:make"
LM = "autotune.pipelines.examples.language_model:make"
EXAMPLES = {"classifier": CLASSIFIER, "lm": LM}
EXTERNAL_DIR = REPO_ROOT / "tests" / "external_pipeline"
FAST = dict(warmup_steps=1, timed_steps=3, window=1)  # a trial long enough to measure, no longer


def returns_42(cfg: Any) -> int:
    """A factory that returns the wrong thing."""
    return 42


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The classifier writes its synthetic set under ./studies/data: keep it in the test's folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def autotune(
    *args: str, cwd: Path, pythonpath: Path | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}  # wide: rich must not wrap the lines we grep
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def write_config(path: Path, **values: Any) -> Path:
    path.write_text(yaml.safe_dump({**FAST, "image_size": 64, **values}))
    return path


def ok(run: subprocess.CompletedProcess[str]) -> None:
    assert run.returncode == 0, f"exit {run.returncode}\nstdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"


# --- in process: the protocol, one step, and learning ---------------------------------------------


@pytest.mark.parametrize("name", EXAMPLES)
def test_factory_satisfies_the_protocol(workdir: Path, name: str) -> None:
    pipeline = load_pipeline(TrialConfig(pipeline=EXAMPLES[name], image_size=64))
    assert isinstance(pipeline, Pipeline)
    model = pipeline.build_model()
    stages = stages_of(pipeline)
    assert stages and all(isinstance(model.get_submodule(s), torch.nn.Module) for s in stages)
    assert unsupported_of(pipeline) <= set(KNOBS)
    assert len(pipeline.build_dataset()) >= 64 * 2  # batch_size 64 fits, with epochs to spare


def _batch(pipeline: Pipeline, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    loader = torch.utils.data.DataLoader(pipeline.build_dataset(), batch_size=n, shuffle=False)
    return next(iter(loader))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_one_step_with_every_stage_checkpointed(workdir: Path, name: str, precision: str) -> None:
    """Forward and backward under autocast, with checkpoint wrappers on every declared stage."""
    cfg = TrialConfig(pipeline=EXAMPLES[name], image_size=64, precision=precision)
    pipeline = load_pipeline(cfg)
    model = pipeline.build_model().train()
    stages = stages_of(pipeline)
    applied = checkpoint_segments.wrap_checkpoints(model, stages, len(stages))
    assert applied["checkpoint_segments"]["in_effect"] == list(stages)
    x, y = _batch(pipeline, 4)
    with knobs.Precision(cfg, torch.device("cpu")).autocast():
        output = model(x)
        loss = pipeline.loss(output, y)
    assert output.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)  # autocast reached the model
    assert loss.dtype == torch.float32 and loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert 0.0 <= pipeline.metric(output, y) <= 1.0  # type: ignore[attr-defined]


@pytest.mark.parametrize("name, size", [("classifier", 32), ("lm", 64)])  # 32 px: four times cheaper, as learnable
def test_loss_falls(workdir: Path, name: str, size: int) -> None:
    cfg = TrialConfig(pipeline=EXAMPLES[name], image_size=size, batch_size=16, lr=1e-3)
    torch.set_num_threads(1)  # on a busy 2-core machine two threads wait on each other for seconds (restored after)
    h = harness.build(cfg)  # the product's own step, as a trial runs it
    stream = h.batches()
    losses = [h.step(next(stream)) for _ in range(30)]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, [round(v, 3) for v in losses]


def test_classifier_dataset(workdir: Path) -> None:
    pipeline = classifier.make(TrialConfig(image_size=64))
    root = workdir / "studies" / "data" / "classifier-synthetic"
    assert pipeline.classes == sorted(c for c, _ in classifier.CLASSES)
    assert len(pipeline.train_samples) + len(pipeline.val_samples) == classifier.SYNTHETIC_N
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]  # no temporary left behind
    stamp = (root / "README.txt").stat().st_mtime_ns
    classifier.make(TrialConfig(image_size=64))
    assert (root / "README.txt").stat().st_mtime_ns == stamp  # generated once, then reused
    x, y = pipeline.build_dataset()[0]
    assert x.shape == (3, 64, 64) and x.dtype == torch.float32 and y.dtype == torch.long and y.dim() == 0
    assert pipeline.build_val_dataset()[0][0].shape == (3, 64, 64)  # type: ignore[attr-defined]


def test_classifier_synthetic_set_is_deterministic_per_seed(tmp_path: Path) -> None:
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.jpg"))}

    a = files(classifier.make_synthetic(tmp_path / "a", n=8, seed=0))
    assert a == files(classifier.make_synthetic(tmp_path / "b", n=8, seed=0))
    assert a != files(classifier.make_synthetic(tmp_path / "c", n=8, seed=1))
    assert len(a) == 8 and {k.split("/")[0] for k in a} == {c for c, _ in classifier.CLASSES}


def test_classifier_refuses_a_segmentation_folder(tmp_path: Path) -> None:
    from autotune.pipelines.unet.data import make_data
    from autotune.core.errors import DataError

    seg = make_data(tmp_path / "seg", n=2, size=(64, 64), seed=0)
    with pytest.raises(DataError, match="one subfolder per class"):
        classifier.make(TrialConfig(data_dir=str(seg)))


def test_language_model_dataset() -> None:
    pipeline = language_model.make(TrialConfig(image_size=48, seed=3))
    ds = pipeline.build_dataset()
    x, y = ds[5]
    assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (48,)  # the context is image_size tokens
    assert torch.equal(x[1:], y[:-1])  # the target is the input shifted by one
    assert torch.equal(ds[5][0], language_model.make(TrialConfig(image_size=48, seed=3)).build_dataset()[5][0])
    assert not torch.equal(ds[5][0], language_model.make(TrialConfig(image_size=48, seed=4)).build_dataset()[5][0])
    assert int(x.max()) < language_model.VOCAB


# --- the CLI: exit 2 for a factory that can't be used ---------------------------------------------


@pytest.mark.parametrize(
    "spec, says",
    [
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("autotune.pipelines.examples.classifier:nope", "no callable 'nope'"),
        ("autotune.pipelines.examples.classifier", "expected 'module.path:factory'"),
        (
            "tests.pipelines.test_examples:returns_42",
            "returned int, expected an object with build_model(), build_dataset() and loss",
        ),
    ],
)
def test_search_refuses_a_bad_factory(
    workdir: Path, repo_on_path: Path, capsys: pytest.CaptureFixture[str], spec: str, says: str
) -> None:
    code = main(["search", "--budget", "1m", "--pipeline", spec])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and says in err, err
    assert not (workdir / "studies.db").exists()  # refused before any study was touched


@pytest.mark.slow
@pytest.mark.side_by_side
@pytest.mark.parametrize(
    "spec, says",
    [
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("tests.pipelines.test_examples:returns_42", "returned int, expected an object with build_model()"),
    ],
)
def test_trial_refuses_a_bad_factory(tmp_path: Path, spec: str, says: str) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    run = autotune("trial", "--pipeline", spec, "--config", str(cfg), cwd=tmp_path, pythonpath=REPO_ROOT)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr, run.stderr


# --- the CLI: trials of the examples and of a pipeline from outside the package -------------------


def _result(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text())
    assert result["status"] == "ok" and result["loss_finite"], result
    return result


@pytest.mark.slow
@pytest.mark.side_by_side
def test_classifier_trial_bf16_with_workers(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", precision="bf16", num_workers=2, batch_size=8)
    run = autotune("trial", "--pipeline", CLASSIFIER, "--config", str(cfg), "--out", "r.json", cwd=tmp_path)
    ok(run)
    applied = _result(tmp_path / "r.json")["applied"]
    assert applied["precision"]["in_effect"] == "bf16" and "autocast(cpu, bf16)" in applied["precision"]["why"]
    assert applied["num_workers"]["in_effect"] == 2 and applied["batch_size"]["in_effect"] == 8
    assert (tmp_path / "studies" / "data" / "classifier-synthetic" / "README.txt").is_file()  # under the cwd


@pytest.mark.slow
@pytest.mark.side_by_side
def test_language_model_trial_bf16(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", precision="bf16", batch_size=16, num_workers=1, checkpoint_segments=2)
    run = autotune("trial", "--pipeline", LM, "--config", str(cfg), "--out", "r.json", cwd=tmp_path)
    ok(run)
    applied = _result(tmp_path / "r.json")["applied"]
    assert applied["precision"]["in_effect"] == "bf16" and "autocast(cpu, bf16)" in applied["precision"]["why"]
    assert applied["batch_size"]["in_effect"] == 16 and applied["num_workers"]["in_effect"] == 1
    assert applied["checkpoint_segments"]["in_effect"] == ["layers.0", "layers.1"]


@pytest.mark.slow
@pytest.mark.side_by_side
def test_language_model_refuses_channels_last(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", channels_last=True)
    run = autotune("trial", "--pipeline", LM, "--config", str(cfg), cwd=tmp_path)
    assert run.returncode == 5, run.stderr
    assert "unsupported" in run.stderr and "channels_last" in run.stderr


@pytest.mark.slow
@pytest.mark.side_by_side
def test_pipeline_from_outside_the_package(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", precision="bf16", num_workers=1, checkpoint_segments=2, batch_size=32)
    run = autotune(
        "trial",
        "--pipeline",
        "my_pipeline:make",
        "--config",
        str(cfg),
        "--out",
        "r.json",
        cwd=tmp_path,
        pythonpath=EXTERNAL_DIR,
    )
    ok(run)
    applied = _result(tmp_path / "r.json")["applied"]
    assert applied["checkpoint_segments"]["in_effect"] == ["0", "2"]
    assert applied["precision"]["in_effect"] == "bf16" and "autocast(cpu, bf16)" in applied["precision"]["why"]
    # Not importable without the PYTHONPATH: bad input, and the message says where to look.
    run = autotune("trial", "--pipeline", "my_pipeline:make", "--config", str(cfg), cwd=tmp_path)
    assert run.returncode == 2 and "PYTHONPATH" in run.stderr, run.stderr


# --- a half-minute search on each example, exported and reproduced --------------------------------
# The knobs' combinations on each example are the trial tests' above (and test_one_step_with_every_stage_
# checkpointed); this one is the path from a search to a reproduced export: three 1-second trials, then the
# parity gate's checks.


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_search_export_reproduce(tmp_path: Path, name: str) -> None:
    spec = EXAMPLES[name]
    run = autotune(
        "search",
        "--budget",
        "30s",
        "--n-trials",  # the baseline, the warm start and one search trial: every kind of trial, no more
        "3",
        "--pipeline",
        spec,
        "--image-size",
        "64",
        "--trial-seconds",
        "1",
        "--warmup-steps",
        "1",
        "--study",
        "ex",
        "--seed",
        "0",
        "--confirm-rounds",
        "0",
        "--parity-steps",  # the gate's checks run on the example too, a third as long as by default
        "10",
        cwd=tmp_path,
        timeout=300,
    )
    ok(run)
    if name == "lm":  # the knob the pipeline declared unsupported is taken out of the space, and said so
        assert "channels_last not searched: not supported by this pipeline" in run.stdout, run.stdout
    _no_trial_broke(tmp_path / "studies.db")

    ok(autotune("export", "--study", "ex", "-o", "best.yaml", cwd=tmp_path))
    exported = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert exported["workload"]["pipeline"] == spec and exported["workload"]["image_size"] == 64
    if name == "lm":
        assert exported["config"]["channels_last"] is False

    run = autotune("trial", "--pipeline", spec, "--config", "best.yaml", "--out", "repro.json", cwd=tmp_path)
    ok(run)
    applied = _result(tmp_path / "repro.json")["applied"]
    assert {k: applied[k]["requested"] for k in KNOBS} == exported["config"]


def _no_trial_broke(storage: Path) -> None:
    """No trial of the search crashed, was refused or went non-finite: every knob combination the
    resolved space allows works with the pipeline. A timeout is allowed: the budget's end may cut the
    last trial short on a busy machine."""
    import optuna

    from autotune.search.store.storage import open_storage

    study = optuna.load_study(study_name="ex", storage=open_storage(str(storage)))
    trials = study.get_trials(deepcopy=False)
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) >= 2, "not even the baseline and one more"
    bad = [
        (t.number, t.user_attrs.get("reason"), t.user_attrs.get("message"))
        for t in trials
        if t.user_attrs.get("reason") in ("crash", "bad_config", "unsupported", "numerics")
    ]
    assert not bad, bad


def test_the_language_model_scales_by_its_name() -> None:
    """make_w<width>_d<depth>: the size is in the pipeline's name, so in the fingerprint and every export."""
    from autotune.pipelines import blocks_of
    from autotune.search.space.machine import fingerprint

    sized = TrialConfig(pipeline="autotune.pipelines.examples.language_model:make_w512_d3", image_size=32)
    pipeline = load_pipeline(sized)
    model = pipeline.build_model()
    assert len(model.layers) == 3 and model.head.in_features == 512  # type: ignore[union-attr,arg-type]
    assert model.layers[0].self_attn.num_heads == 8  # type: ignore[index,union-attr]  # one per 64 above 256
    assert blocks_of(pipeline) == stages_of(pipeline) == ("layers.0", "layers.1", "layers.2")
    default = load_pipeline(TrialConfig(pipeline=LM, image_size=32)).build_model()
    assert sum(p.numel() for p in model.parameters()) > 10 * sum(p.numel() for p in default.parameters())
    assert fingerprint(sized)["pipeline"] != fingerprint(sized.replace(pipeline=LM))["pipeline"]


@pytest.mark.parametrize(
    "name, words",
    [
        ("make_w130_d2", "width must be a multiple of 4 from 16 to 256, or of 64 above"),
        ("make_w8_d2", "got width 8, depth 2"),
        ("make_w288_d2", "or of 64 above"),
        ("make_w64_d0", "depth from 1 to 1024"),
        ("make_wide", "has no callable 'make_wide'"),
    ],
)
def test_a_bad_language_model_size_is_bad_input(name: str, words: str) -> None:
    from autotune.core.errors import PipelineError

    with pytest.raises(PipelineError, match=words) as e:
        load_pipeline(TrialConfig(pipeline=f"autotune.pipelines.examples.language_model:{name}"))
    assert "\n" not in str(e.value)
