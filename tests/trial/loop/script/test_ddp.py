"""gpus for a user's script (issue 42): a script that sets up its own process group runs under torchrun,
one rank per GPU (2 gloo ranks on this CPU), its DDP set-up untouched; each rank runs the seams, and the
trial records the world size and the global batch the ranks ran, with the lr set for that batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.core.config import TrialConfig, lr_factor
from autotune.pipelines import script
from autotune.trial.processes import launcher

pytestmark = [pytest.mark.usefixtures("repo_on_path"), pytest.mark.slow, pytest.mark.side_by_side]
SCRIPTS = Path(__file__).parent / "scripts"
OWN_LR, OWN_GLOBAL = 0.01, 4 * 2  # the scripts' own lr, batch 4 x accumulation 2


@pytest.mark.parametrize(
    ("name", "global_batch"),
    [
        ("ddp_keeps_batch.py", 2 * 4 * 2),  # each rank its own 4 x 2: twice the script's global batch
        ("ddp_divides_accumulation.py", 4 * 2),  # 4 x (2 // 2) on each of 2 ranks: its own global batch
        # No DataLoader: counted from what its steps consumed (their backward passes), not from the 4 x 2
        # at.batch_size() and at.accumulation() handed over (a public script was recorded at 48, ran 24).
        ("ddp_no_loader.py", 4 * 2),
    ],
)
def test_a_script_with_its_own_process_group_runs_as_two_gloo_ranks(
    tmp_path: Path, name: str, global_batch: int
) -> None:
    spec = script.spec_of(str(SCRIPTS / name), [str(tmp_path)])
    cfg = TrialConfig(pipeline=spec, gpus=2, batch_size=4, warmup_steps=1, timed_steps=3, window=1, num_threads=1)
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    a, seen = r.applied, r.applied["observed"]
    assert r.status == "ok" and r.world_size == 2
    assert seen["world_size"] == seen["process_group_size"] == 2 and seen["process_group_backend"] == "gloo"
    assert a["gpus"]["in_effect"] == 2
    assert seen["samples_per_step_per_rank"] == global_batch // 2 and seen["global_batch"] == global_batch
    assert a["global_batch"] == {"requested": 16, "in_effect": global_batch, "why": a["global_batch"]["why"]}
    # The lr follows the batch the ranks ran, by AdamW's rule, in the record and in each rank's optimizer
    # (after its schedule's step: the schedule was set for it too).
    lr = OWN_LR * lr_factor(global_batch / OWN_GLOBAL, cfg.lr_scaling)
    assert a["lr"]["in_effect"] == pytest.approx(lr)
    assert [float((tmp_path / f"lr.rank{rank}").read_text()) for rank in (0, 1)] == pytest.approx([lr, lr])
    # Samples/s counts both ranks' samples.
    assert a["script"]["samples_per_step"] == global_batch // 2
