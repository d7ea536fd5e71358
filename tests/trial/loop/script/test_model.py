"""trial/loop/script (model, precision, channels_last, checkpointing, loader): precision, channels_last and
checkpoint_segments reach a script with no autotune line in it, through the model its optimizer trains, and
the batch through its DataLoader, each recorded as observed; a script whose own
autocast runs bf16 has bf16 as its baseline; a script with two optimizers keeps them, with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.core.settings import SearchSettings
from autotune.pipelines import base_config, load_pipeline, script
from autotune.search.space.machine import Hardware
from autotune.search.space.resolve import model_kept, rebased, resolve
from autotune.search.space.reading import load_space
from autotune.search.space.spec import DEFAULT_SPACE, Fixed
from autotune.trial.processes import launcher

pytestmark = [pytest.mark.usefixtures("repo_on_path"), pytest.mark.slow, pytest.mark.side_by_side]
SCRIPT = Path(__file__).parent / "scripts" / "unedited" / "train.py"


def trial(tmp_path: Path, *args: str, **knobs: object) -> dict:
    cfg = TrialConfig(
        pipeline=script.spec_of(str(SCRIPT), list(args)), warmup_steps=1, timed_steps=3, window=1, **knobs
    )
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    assert r.status == "ok", r.message
    return dict(r.applied)


def test_the_unedited_script_takes_precision_channels_last_and_checkpointing(tmp_path: Path) -> None:
    job = script.load(TrialConfig(pipeline=script.spec_of(str(SCRIPT))))
    assert {"precision", "channels_last", "checkpoint_segments"} <= job.routed
    assert not {"precision", "channels_last", "checkpoint_segments"} & set(job.unsupported)
    assert "fp16" in job.unsupported.values["precision"]  # no GradScaler handed over: fp16 is not searched
    assert "batch_size" not in job.unsupported and job.own == (8, 1)  # its DataLoader's, searched with no edit
    a = trial(tmp_path, precision="bf16", checkpoint_segments=2, channels_last=True, batch_size=32)
    assert a["precision"]["in_effect"] == "bf16" and "autocast around its forward" in a["precision"]["why"]
    assert a["channels_last"]["in_effect"] is True
    assert a["checkpoint_segments"]["in_effect"] == ["blocks.0", "blocks.1"]
    seen = a["observed"]  # what the model showed as it ran, in the record scripts/gpu_check.sh reads
    assert seen["model_output_precision"] == "bf16" and seen["model_weights_channels_last"] is True
    assert seen["model_checkpointed_blocks"] == 2 and seen["model_replicated"] is False
    assert "2 of its 4 Block block(s)" in a["checkpoint_segments"]["why"]
    # The activation memory it freed, counted at its first forward (at batch 32, inside the bf16 autocast).
    freed = seen["model_activation_bytes"]
    assert freed["freed"] > 0 and freed["held"] > 0, freed
    assert "of the activations its first forward saved for backward freed" in a["checkpoint_segments"]["why"]
    assert a["script"]["model"] == {
        "model": "Net",
        "optimizers": 1,
        "convolutions": 5,
        "repeated_blocks": 4,
        "block": "Block",
        "replicated_by_trial": True,
        "routed": ["checkpoint_segments", "channels_last", "precision", "compile"],  # the knob list's order
    }
    log = (tmp_path / "trial" / "trial.log").read_text()
    assert "torch.float32" in log and "torch.bfloat16" not in log  # the loss outside the model ran in fp32
    # The batch through its DataLoader: 32 samples a step, its own 8 recorded, the lr by AdamW's sqrt rule.
    # Given as its own option too (--batch-size 32 on its command line), so its own view(args.batch_size)
    # sees the batch its DataLoader builds with.
    assert a["batch_size"]["in_effect"] == 32
    assert "its DataLoader's batch_size, given as its own option --batch-size 32, no edit" in a["batch_size"]["why"]
    assert a["script"]["samples_per_step"] == 32 and a["global_batch"]["in_effect"] == 32
    assert a["script"]["own"]["batch_size"] == 8
    assert a["lr"]["requested"] == pytest.approx(1e-3) and a["lr"]["in_effect"] == pytest.approx(2e-3)


def test_an_lr_the_script_scales_with_its_batch_option_is_scaled_once(tmp_path: Path) -> None:
    """lr = 1e-3 * args.batch_size / 8: at batch 32 the script's own arithmetic gives 4e-3 (--batch-size 32 is on
    its command line), the linear rule it follows is the study's, and the trial scales it no further."""
    path = tmp_path / "train.py"
    source = SCRIPT.read_text()
    scaled = source.replace("model.parameters(), lr=1e-3)", "model.parameters(), lr=1e-3 * args.batch_size / 8)")
    assert scaled != source
    path.write_text(scaled)
    base = base_config(script.spec_of(str(path)), None, None, str(tmp_path))
    assert base.lr_scaling == "linear"  # its own rule, not AdamW's sqrt
    cfg = base.replace(batch_size=32, warmup_steps=1, timed_steps=3, window=1, num_threads=1)
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    assert r.status == "ok", r.message
    lr = r.applied["lr"]
    assert lr["requested"] == pytest.approx(1e-3) and lr["in_effect"] == pytest.approx(4e-3), lr
    assert "its own arithmetic gave 0.004 for --batch-size 32" in lr["why"], lr["why"]


def test_the_baseline_is_watched_and_an_own_autocast_is_its_precision(tmp_path: Path) -> None:
    a = trial(tmp_path, "--own-autocast")  # the baseline: nothing applied, the model watched
    assert a["precision"]["in_effect"] == "bf16" and a["script"]["model"]["own_precision"] == "bf16"
    assert a["checkpoint_segments"]["in_effect"] == [] and a["channels_last"]["in_effect"] is False
    base = TrialConfig(pipeline=script.spec_of(str(SCRIPT), ["--own-autocast"]))
    after = rebased(base, a)
    assert after is not None and dict(after.baseline or ())["precision"] == "bf16"
    # A trial at fp32 runs the model outside the script's own autocast, and says so.
    fp32 = trial(tmp_path / "fp32", "--own-autocast", precision="fp32", baseline=(("precision", "bf16"),))
    assert (
        fp32["precision"]["in_effect"] == "fp32"
        and "inside the script's own autocast (bf16)" in fp32["precision"]["why"]
    )


def test_two_optimizers_keep_the_model_knobs_with_the_reason(tmp_path: Path) -> None:
    cfg = TrialConfig(pipeline=script.spec_of(str(SCRIPT), ["--gan"]), warmup_steps=1, timed_steps=3, window=1)
    with pytest.raises(TrialUnsupported, match="builds 2 optimizers .*channels_last cannot be applied"):
        launcher.run_trial(cfg.replace(channels_last=True), tmp_path / "t", timeout_s=300)
    baseline = trial(tmp_path / "b", "--gan")
    space = load_space(DEFAULT_SPACE)
    kept, why = model_kept(space, cfg, baseline)
    # gpus too: on several GPUs the trial would replicate the model, and there is no one model to replicate.
    assert "gpus" in space.searched()
    assert set(why) == {"precision", "channels_last", "checkpoint_segments", "compile", "gpus"} & set(space.searched())
    assert all("2 optimizers" in reason for reason in why.values())


def test_compile_reaches_the_unedited_script_s_model_and_is_observed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward of the model its optimizer trains compiled in place, with no at.model(): in effect only
    where dynamo compiled graphs as it ran. dynamo's eager backend: its graphs, without inductor's code."""
    from autotune.trial.loop.knobs import COMPILE_BACKEND_ENV

    monkeypatch.setenv(COMPILE_BACKEND_ENV, "eager")
    job = script.load(TrialConfig(pipeline=script.spec_of(str(SCRIPT))))
    assert "compile" in job.routed and "compile" not in job.unsupported
    a = trial(tmp_path, compile="default", precision="bf16")
    assert a["compile"]["in_effect"] == "default", a["compile"]
    assert "its forward torch.compile'd in place" in a["compile"]["why"]
    assert a["precision"]["in_effect"] == "bf16"  # the autocast hooks run eagerly around the compiled forward
    baseline = trial(tmp_path / "b")
    assert baseline["compile"] == {"requested": "off", "in_effect": "off", "why": baseline["compile"]["why"]}


def test_a_search_of_the_unedited_script_searches_its_batch_and_the_model_knobs() -> None:
    """What `autotune search --script` searches on the unedited script on this CPU: its batch (through its
    DataLoader), precision, channels_last and checkpoint_segments; compile fixed off without CUDA, as before."""
    if Hardware.detect().cuda:
        pytest.skip("compile is searched where CUDA is")
    base = TrialConfig(pipeline=script.spec_of(str(SCRIPT)))
    said: list[str] = []
    space, _, _ = resolve(load_space(DEFAULT_SPACE), load_pipeline(base), SearchSettings(base=base), base, said.append)
    assert {"batch_size", "precision", "channels_last", "checkpoint_segments"} <= set(space.searched()), said
    assert space.knobs["compile"] == Fixed("off") and any("compile fixed to 'off': no CUDA" in s for s in said)
