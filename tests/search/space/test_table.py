"""The knob table: README's "What it searches" is `autotune knobs --markdown`, and each knob's declared
training-math column agrees with what core/training.py labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main
from autotune.core.config import TABLE, TrialConfig, dependents
from autotune.core.errors import ConfigError
from autotune.core.training import training_math
from autotune.search.space import table
from autotune.search.space.reading import load_space
from autotune.search.space.spec import DEFAULT_SPACE, spec_values

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_table_is_the_generated_one() -> None:
    generated = table.markdown(load_space(DEFAULT_SPACE))
    assert generated in README.read_text(), "README's knob table is stale: paste `autotune knobs --markdown`"


def test_the_command_prints_every_knob(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["knobs", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out == table.markdown(load_space(DEFAULT_SPACE))
    assert [line.split("|")[1].strip(" `") for line in out.splitlines()[2:]] == [k.name for k in TABLE]
    assert main(["knobs"]) == 0
    assert "channels_last" in capsys.readouterr().out


def test_a_space_file_of_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "s.yaml"
    space.write_text("knobs:\n  num_workers: {low: 0, high: 2}\n  precision: bf16\n")
    assert main(["knobs", "--markdown", "--space", str(space)]) == 0
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[4].strip() for line in capsys.readouterr().out.splitlines()[2:]
    }
    assert rows["num_workers"] == "0-2" and rows["precision"] == "fixed: bf16" and rows["compile"] == "not searched"
    space.write_text("knobs:\n  warp_speed: [1, 2]\n")
    assert main(["knobs", "--space", str(space)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warp_speed" in err[0]


def _enabling(name: str) -> dict[str, object]:
    """What a knob needs to be in effect (worker processes, several processes, FSDP)."""
    if name in dependents("workers"):
        return {"num_workers": 2}
    if name in dependents("processes"):
        return {"gpus": 2}
    if name in dependents("fsdp"):
        return {"gpus": 2, "parallel": "fsdp"}
    return {}


@pytest.mark.parametrize("knob", TABLE, ids=lambda k: k.name)
def test_declared_math_is_what_training_labels(knob) -> None:  # type: ignore[no-untyped-def]
    """A knob declared speed-only changes no label for any value of its space; one declared to change the
    math changes one for some value."""
    spec = load_space(DEFAULT_SPACE)[knob.name]
    values = spec_values(spec)
    changed = []
    for value in values:
        reference = TrialConfig(**_enabling(knob.name))  # type: ignore[arg-type]
        try:
            cfg = reference.replace(**{knob.name: value}, baseline=tuple(reference.knobs().items()))
        except ConfigError:  # a value the config refuses on its own (prefetch without workers)
            continue
        changed.append(bool(training_math(cfg, batch_norm=True)))
    assert changed, f"no value of {knob.name} builds a config"
    assert any(changed) == bool(knob.math), f"{knob.name}: declared math {knob.math!r}, labelled {changed}"
