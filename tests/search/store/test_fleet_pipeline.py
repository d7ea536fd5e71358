"""fleet.check_pipeline: which of a study's pipelines a worker accepts, by the worker's own allow-list."""

from __future__ import annotations

import optuna
import pytest

from autotune.core.config import TrialConfig
from autotune.core.errors import PipelineError
from autotune.search.store import fleet


def study_for(pipeline: str) -> optuna.Study:
    study = optuna.create_study(study_name="s")
    study.set_user_attr("workload", TrialConfig(pipeline=pipeline).workload())
    return study


@pytest.mark.parametrize(
    "pipeline, allowed",
    [
        ("tests.fault_pipelines:tiny", ["tests.fault_pipelines:tiny"]),
        ("tests.fault_pipelines:nan", ["tests.fault_pipelines:tiny", "tests.fault_pipelines:nan"]),
        ("unet", fleet.DEFAULT_ALLOWED),
        ("autotune.pipelines.unet.pipeline:UnetPipeline", fleet.DEFAULT_ALLOWED),  # the built-in by its import
    ],
)
def test_an_allowed_pipeline_is_accepted(pipeline: str, allowed: list[str]) -> None:
    fleet.check_pipeline(study_for(pipeline), allowed)


@pytest.mark.parametrize(
    "pipeline, allowed",
    [
        ("tests.fault_pipelines:nan", ["tests.fault_pipelines:tiny"]),
        ("lightning:tests.fault_pipelines:tiny", ["tests.fault_pipelines:tiny"]),  # another trainer, exactly named
        ("tests.fault_pipelines:tiny", fleet.DEFAULT_ALLOWED),
    ],
)
def test_any_other_is_refused_naming_it(pipeline: str, allowed: list[str]) -> None:
    with pytest.raises(PipelineError, match="not one this worker may run") as e:
        fleet.check_pipeline(study_for(pipeline), allowed)
    assert repr(pipeline) in str(e.value) and "\n" not in str(e.value)
