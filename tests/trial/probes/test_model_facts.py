"""The probe measures the model facts the memory estimate needs, in a process of its own: parameter
counts, and the bytes autograd saves for backward, which agree with the figures worked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.pipelines.examples.language_model import TinyLM
from autotune.trial.probes.model_facts import ProbeError, SavedBytes, run_probe
from tests.trial.probe_pipelines import PARAMS, SAVED_PER_SAMPLE, MlpPipeline

MLP = TrialConfig(pipeline="tests.trial.probe_pipelines:mlp")
LM = TrialConfig(pipeline="autotune.pipelines.examples.language_model:make", image_size=32)


def test_saved_bytes_counts_what_autograd_keeps_once_by_storage_and_no_parameters() -> None:
    pipeline = MlpPipeline(MLP)
    model = pipeline.build_model()
    x, y = torch.randn(3, 8), torch.randn(3, 4)
    with SavedBytes(model, pipeline.stages) as saved:
        pipeline.loss(model(x), y)
    assert saved.total == 3 * SAVED_PER_SAMPLE
    # Stage "0" saves its input (8 floats); the ReLU's output, which "2" saves too, was seen before it.
    assert saved.inside == [3 * 8 * 4, 0] and saved.inputs == [3 * 8 * 4, 3 * 16 * 4]
    assert saved.before == [0, 3 * (8 + 16) * 4]


def test_saved_bytes_sees_nothing_outside_its_block() -> None:
    model = MlpPipeline(MLP).build_model()
    saved = SavedBytes(model)
    with saved:
        pass
    model(torch.randn(2, 8)).sum()
    assert saved.total == 0


def test_the_probe_process_measures_the_hand_figures(repo_on_path: Path, tmp_path: Path) -> None:
    facts = run_probe(MLP, tmp_path / "probe", timeout_s=120)
    assert facts["param_count"] == PARAMS
    assert facts["activation_bytes_per_sample"] == SAVED_PER_SAMPLE
    assert facts["stage_activation_bytes"] == [8 * 4, 0] and facts["stage_input_bytes"] == [8 * 4, 16 * 4]
    # No `blocks`: the stages stand in for them (8 x 16 + 16 and 16 x 4 + 4 parameters).
    assert facts["largest_block_params"] == 144 and facts["blocks_param_count"] == PARAMS
    assert facts["device"] == "cpu" and facts["batch"] == 2 and facts["runtime_bytes"] > 0


def test_the_probe_on_the_language_model_agrees_with_a_direct_measurement(repo_on_path: Path, tmp_path: Path) -> None:
    facts = run_probe(LM, tmp_path / "probe", timeout_s=120)
    model = TinyLM(32)
    assert facts["param_count"] == sum(p.numel() for p in model.parameters())
    assert facts["largest_block_params"] == sum(p.numel() for p in model.layers[0].parameters())
    ids = torch.randint(0, 256, (2, 33))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # as collated: a view would count its whole storage
    with SavedBytes(model) as saved:  # the same model and batch, measured here: the same bytes
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    assert facts["activation_bytes_per_sample"] == saved.total / 2
    # The two blocks save the same, most of the whole; a block's input is one (32 x 128) fp32 tensor.
    inside = facts["stage_activation_bytes"]
    assert len(inside) == 2 and inside[0] == inside[1] and 0.5 < sum(inside) / facts["activation_bytes_per_sample"] < 1
    assert facts["stage_input_bytes"] == [32 * 128 * 4] * 2


def test_a_pipeline_that_cannot_be_probed_is_a_probe_error(repo_on_path: Path, tmp_path: Path) -> None:
    # The probe ends as every autotune process does: one line with its status, and that status's exit code.
    with pytest.raises(ProbeError, match="exited with code 2: autotune probe: bad_config: .*cannot import"):
        run_probe(TrialConfig(pipeline="tests.no_such_module:make"), tmp_path / "probe", timeout_s=120)
