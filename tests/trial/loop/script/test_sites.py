"""A script trial records where the script built each DataLoader and optimizer (the user's call: file,
line, columns), what it gave the knobs there and what ran, and whether the trial iterated or stepped it:
what `export --format diff` edits, and only that."""

from __future__ import annotations

from pathlib import Path

from autotune.core.config import TrialConfig
from autotune.pipelines import script
from autotune.trial.loop import worker


def test_the_trial_records_each_loader_and_optimizer_it_ran_where_the_script_built_it(classifier: Path) -> None:
    cfg = TrialConfig(
        pipeline=script.spec_of(str(classifier), ["--steps", "40"]),
        warmup_steps=1,
        timed_steps=2,
        window=1,
        num_threads=1,
        num_workers=1,
        optimizer_fusion="fused",
    )
    r = worker.run(cfg)
    sites = r.applied["script"]["sites"]
    source = classifier.read_text().splitlines()
    train, val = sites["loaders"]
    assert source[train["line"] - 1].strip().startswith("train_loader = DataLoader(")
    assert train["file"] == str(classifier) and train["iterated"] is True
    own = {"batch_size": 8, "num_workers": 0, "pin_memory": True, "prefetch_factor": None, "persistent_workers": False}
    assert train["own"] == own
    assert train["ran"]["num_workers"] == 1 and train["ran"]["pin_memory"] is False and train["ran"]["batch_size"] == 8
    # the validation loader is built, but the trial ends inside the first epoch: never iterated
    assert source[val["line"] - 1].strip().startswith("val_loader = DataLoader(") and val["iterated"] is False
    (optimizer,) = sites["optimizers"]
    model = classifier.parent / "tinymodel.py"
    assert optimizer["file"] == str(model) and optimizer["type"] == "AdamW"
    assert "torch.optim.AdamW(" in model.read_text().splitlines()[optimizer["line"] - 1]
    assert optimizer["stepped"] is True and optimizer["ran"] == "fused"
    assert optimizer["own"] == {"fused": None, "foreach": None}
