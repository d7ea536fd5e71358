"""core/knobs/__init__.py: the knob list is the one order the trial, the diff and the space read; each listed
knob is one module, named by few others."""

from __future__ import annotations

import re
from pathlib import Path

from autotune.core import knobs
from autotune.core.config import KNOBS, TABLE, TrialConfig
from autotune.trial.loop import knobs as torch_side

PACKAGE = Path(__file__).resolve().parents[3] / "autotune"


def test_each_listed_knob_is_a_config_field_with_its_modules_row() -> None:
    rows = {k.name: k for k in TABLE}
    for k in knobs.ALL:
        assert k.NAME in KNOBS
        assert rows[k.NAME].default == k.ROW.default and rows[k.NAME].sets == k.ROW.metadata["knob"]["sets"]


def test_every_knob_of_the_table_has_its_module() -> None:
    """Each TrialConfig knob takes its row from a module of the list, or of a group's (the DataLoader's four,
    the strategy's five): the field's row is that module's object, not a copy."""
    from dataclasses import fields

    owned = {k.NAME: k.ROW for k in knobs.ALL} | knobs.loader.ROWS | knobs.strategy.ROWS
    assert set(owned) == set(KNOBS)
    by_name = {f.name: f for f in fields(TrialConfig)}
    assert all(by_name[name].metadata is row.metadata for name, row in owned.items())


def test_the_model_knobs_apply_in_torchtitans_order_and_their_torch_side_is_found_by_name() -> None:
    assert knobs.MODEL_NAMES == ("checkpoint_segments", "channels_last", "precision", "compile")
    assert [m.__name__ for m in torch_side.MODEL] == [f"autotune.trial.loop.knobs.{n}" for n in knobs.MODEL_NAMES]
    assert [m.NAME for m in torch_side.BEFORE_PARALLEL] == ["checkpoint_segments", "channels_last"]


def test_every_export_format_joins_the_knobs_lines_in_the_lists_order() -> None:
    cfg = TrialConfig(tf32=True, cudnn_benchmark=True, channels_last=True, checkpoint_segments=2, num_threads=3)
    lines = knobs.each("accelerate_code", cfg)
    assert lines[0] == "torch.backends.cudnn.benchmark = True"  # the process flags first, as the trial sets them
    assert lines[1:3] == [f"{flag} = True  # autotune: tf32" for flag in knobs.BY_NAME["tf32"].FLAGS]
    assert lines[3] == "torch.set_num_threads(3)"
    assert lines[4].startswith("# checkpoint_segments=2") and "channels_last" in lines[5]  # then the model's, in order


def test_the_trainers_cannot_express_what_the_knobs_say() -> None:
    from autotune.pipelines.frameworks import hf, lightning

    assert knobs.not_in("lightning") == {
        "checkpoint_segments": knobs.BY_NAME["checkpoint_segments"].NOT_IN["lightning"],
        "channels_last": knobs.BY_NAME["channels_last"].NOT_IN["lightning"],
        "optimizer_fusion": knobs.BY_NAME["optimizer_fusion"].NOT_IN["lightning"],
        "set_to_none": knobs.BY_NAME["set_to_none"].NOT_IN["lightning"],
    }
    assert knobs.not_in("lightning").items() <= lightning.UNSUPPORTED.items()
    assert knobs.not_in("hf").items() <= hf.UNSUPPORTED.items()


def test_each_knob_maps_itself_onto_the_trainers_arguments_both_ways() -> None:
    """What a trial sets over a Trainer's arguments is read back as the user's own: each knob's fields for a
    config, read by its own reader, give that config's value."""
    from types import SimpleNamespace

    cfg = TrialConfig(
        precision="bf16", compile="reduce-overhead", checkpoint_segments=1, optimizer_fusion="fused", batch_size=24
    )
    hf_args = SimpleNamespace(
        bf16=False, fp16=False, torch_compile=False, torch_compile_mode=None, gradient_checkpointing=False, optim="x"
    )
    for name, value in knobs.merged("hf_fields", cfg, hf_args).items():
        setattr(hf_args, name, value)
    assert knobs.own("hf_own", hf_args) == {
        "precision": "bf16",
        "compile": "reduce-overhead",
        "checkpoint_segments": 1,
        "optimizer_fusion": "fused",
        "batch_size": 24,
    }
    trainer = knobs.merged("lightning_fields", TrialConfig(precision="bf16", cudnn_benchmark=True))
    assert trainer == {"benchmark": True, "precision": "bf16-mixed", "devices": 1, "strategy": "auto"}
    assert knobs.own("lightning_own", trainer) == {"cudnn_benchmark": True, "precision": "bf16"}
    assert knobs.merged("hf_fields", cfg, hf_args, skip={"optimizer_fusion"}).keys() == {
        "bf16",
        "fp16",
        "torch_compile",
        "torch_compile_mode",
        "gradient_checkpointing",
        "per_device_train_batch_size",
    }


# The measure of a knob's story having one owner: the product modules that name it as a word.
OWNED = {"channels_last": 8, "checkpoint_segments": 8, "tf32": 3}


def test_a_listed_knob_is_named_in_few_modules() -> None:
    where: dict[str, list[str]] = {k: [] for k in OWNED}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        for knob in OWNED:
            if re.search(rf"\b{knob}\b", text):
                where[knob].append(str(path.relative_to(PACKAGE)))
    over = {k: mods for k, mods in where.items() if len(mods) > OWNED[k]}
    assert not over, over
    assert where["tf32"] == ["core/config.py", "core/knobs/__init__.py", "core/knobs/tf32.py"]


def test_the_guides_say_each_knobs_published_value_on_the_machine() -> None:
    """The warm start is every knob's `guide`: AMP in the format the devices compute natively (fp16 on a GPU
    without bf16, none on a CPU without it), a worker per usable CPU with persistence and a prefetch (none
    without workers), pinned memory and cudnn.benchmark only on CUDA, fused AdamW, gradients freed."""
    from autotune.core.knobs.row import Guided

    cpu = knobs.guides(Guided(cuda=False, bf16=True, workers=2))
    assert cpu == {
        "cudnn_benchmark": False,
        "precision": "bf16",
        "optimizer_fusion": "fused",
        "set_to_none": True,
        "num_workers": 2,
        "pin_memory": False,
        "persistent_workers": True,
        "prefetch_factor": 2,
    }
    old_gpu = knobs.guides(Guided(cuda=True, bf16=False, workers=0))
    assert old_gpu["precision"] == "fp16" and old_gpu["pin_memory"] and old_gpu["cudnn_benchmark"]
    assert old_gpu["persistent_workers"] is False and old_gpu["prefetch_factor"] is None
    assert knobs.guides(Guided(cuda=False, bf16=False, workers=1))["precision"] == "fp32"
    assert set(cpu) <= set(KNOBS)
