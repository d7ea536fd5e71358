"""autotune.pipelines.kind: each kind of job answers what the search, a trial and the export ask of it, and
the jobs that train in their own loop share one base without each other's parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from autotune.core.errors import PipelineError
from autotune.pipelines import BUILTIN, kind_of, load_pipeline, own_baseline, preload_modules
from autotune.pipelines.frameworks import FrameworkJob
from autotune.pipelines.own_loop import OwnLoopJob
from autotune.pipelines.script import NOT_REPRODUCIBLE, ScriptJob
from tests.pipelines.script_helpers import EXAMPLE


def test_each_kind_is_read_from_its_prefix_and_nothing_else() -> None:
    named = {
        "unet": "pipeline",
        "autotune.pipelines.examples.classifier:make": "pipeline",
        "lightning:tests.pipelines.lightning_jobs:make": "lightning",
        "hf:tests.pipelines.hf_jobs:make": "hf",
        "script:/abs/train.py --epochs 1": "script",
        # A module whose name starts like a prefix is still a factory: the prefix ends at its colon.
        "scripts.train:make": "pipeline",
        "hfx:make": "pipeline",
    }
    assert {spec: kind_of(spec).name for spec in named} == named
    assert kind_of("unet").spec == "unet"


@pytest.mark.parametrize(
    ("spec", "loop", "exports"),
    [
        ("unet", "autotune", ()),
        ("lightning:m:f", "trainer", ("lightning",)),
        ("hf:m:f", "trainer", ("hf",)),
        ("script:/abs/train.py", "script", ("script", "diff")),
    ],
)
def test_whose_loop_runs_decides_what_can_be_built_apart(spec: str, loop: str, exports: tuple[str, ...]) -> None:
    kind = kind_of(spec)
    assert kind.loop == loop and kind.exports == exports
    apart = loop == "autotune"
    assert kind.builds_model_apart is kind.can_probe_memory is kind.can_draw_model_once is apart
    if apart:
        assert kind.why_no_ceiling is None
    else:
        assert kind.why_no_ceiling is not None and "trains in its own loop" in kind.why_no_ceiling


@pytest.mark.parametrize(
    ("spec", "runs_alone", "learns_from_trial0", "has_run_command", "framework"),
    [
        ("unet", False, False, False, None),
        ("pkg.mod:make", False, False, False, None),
        ("lightning:m:f", False, False, False, "lightning"),
        ("hf:m:f", False, False, False, "hf"),
        ("script:/abs/train.py --epochs 1", True, True, True, None),
    ],
)
def test_each_kind_answers_each_capability_by_name(
    spec: str, runs_alone: bool, learns_from_trial0: bool, has_run_command: bool, framework: str | None
) -> None:
    kind = kind_of(spec)
    assert kind.runs_alone is runs_alone  # the search's alone rounds and their share of the budget
    assert kind.learns_from_trial0 is learns_from_trial0  # trial 0's script lessons
    assert kind.has_run_command is has_run_command  # `autotune run --config best.yaml`
    assert kind.framework == framework  # best.yaml's framework.library, the framework export's format


def test_a_framework_job_reads_its_library_from_its_kind() -> None:
    class Job(FrameworkJob):
        def own_baseline(self, global_batch: int | None = None) -> dict[str, object]:
            return {}

    assert Job("lightning:m:f", (), {}).library == "lightning"
    assert Job("hf:m:f", (), {}).library == "hf"


def test_the_ceiling_says_which_kind_trains_in_its_own_loop() -> None:
    assert kind_of("lightning:m:f").why_no_ceiling == (
        "a framework pipeline trains in its own loop; the compute-only step needs autotune's own loop, "
        "which steps the model on a few cached batches"
    )
    assert kind_of("script:/x.py").why_no_ceiling == (
        "a user's script trains in its own loop; the compute-only step needs autotune's own loop, "
        "which steps the model on a few cached batches"
    )


def test_the_factory_is_what_the_spec_imports() -> None:
    assert kind_of("unet").factory == BUILTIN["unet"]
    assert kind_of("pkg.mod:make").factory == "pkg.mod:make"
    assert kind_of("lightning:pkg.mod:make").factory == kind_of("hf:pkg.mod:make").factory == "pkg.mod:make"
    assert kind_of("script:/abs/train.py").factory is None


def test_a_warm_server_preloads_each_kinds_libraries_and_its_factorys_module() -> None:
    assert preload_modules("unet") == (
        "torchvision",
        "segmentation_models_pytorch",
        "autotune.pipelines.unet.data",
        "autotune.pipelines.unet.pipeline",
    )
    assert preload_modules("pkg.mod:make") == ("pkg.mod",)
    assert preload_modules("lightning:pkg.mod:make") == ("lightning.pytorch", "pkg.mod")
    assert preload_modules("hf:pkg.mod:make") == ("transformers", "transformers.trainer", "pkg.mod")
    assert preload_modules("script:/abs/train.py") == ("torch.utils.data",)  # the script runs in the trial


def test_only_a_script_runs_alone_and_is_normalized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLE.parent)
    kind = kind_of("script:plain_script.py 'my data' --epochs 1")
    assert kind.normalize() == f"script:{EXAMPLE} 'my data' --epochs 1"
    assert kind_of(kind.normalize()).alone_command() == f"python {EXAMPLE} 'my data' --epochs 1"
    for spec in ("unet", "pkg.mod:make", "lightning:pkg.mod:make", "hf:pkg.mod:make"):
        assert kind_of(spec).normalize() == spec and kind_of(spec).alone_command() is None
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PipelineError, match="no such file"):
        kind_of("script:missing.py").normalize()


def test_a_scripts_study_defaults_come_from_its_source() -> None:
    spec = kind_of(f"script:{EXAMPLE} data").normalize()
    assert kind_of(spec).study_defaults(None) == {"lr_scaling": "linear", "lr": 0.05}  # SGD, --lr's default
    assert kind_of(spec).study_defaults(None, given=("lr", "lr_scaling")) == {}
    assert kind_of("unet").study_defaults(64) == {}


def test_only_a_script_that_never_seeds_torch_cannot_be_checked(tmp_path: Path) -> None:
    (tmp_path / "unseeded.py").write_text("import torch\nmodel = torch.nn.Linear(2, 1)\n")
    seeded = TrialConfig(pipeline=f"script:{EXAMPLE} data")
    unseeded = TrialConfig(pipeline=f"script:{tmp_path / 'unseeded.py'}")
    assert kind_of(seeded.pipeline).why_not_checkable(seeded) is None
    assert kind_of(unseeded.pipeline).why_not_checkable(unseeded) == NOT_REPRODUCIBLE
    assert kind_of("unet").why_not_checkable(TrialConfig()) is None


def test_a_script_and_a_framework_job_share_a_base_not_each_others_parts() -> None:
    job = load_pipeline(TrialConfig(pipeline=f"script:{EXAMPLE} data"))
    assert isinstance(job, ScriptJob) and isinstance(job, OwnLoopJob) and not isinstance(job, FrameworkJob)
    assert not hasattr(job, "parts") and not hasattr(job, "library")
    assert issubclass(FrameworkJob, OwnLoopJob)
    for build in (job.build_model, job.build_dataset, lambda: job.loss(None, None)):
        with pytest.raises(PipelineError, match="is your own script, run whole"):
            build()
    # The example keeps its own batch: its DataLoader's, read from the source.
    assert own_baseline(job) == {"batch_size": 8}


def test_an_own_loop_job_must_say_its_baseline_and_why_it_is_not_built() -> None:
    class Half(OwnLoopJob):
        def not_built(self) -> str:
            return "no"

    with pytest.raises(TypeError, match="own_baseline"):
        Half("x:y", {})  # type: ignore[abstract]
