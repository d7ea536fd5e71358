"""The cooperative API for a plain PyTorch script tuned by autotune: `from autotune import script as at`.

Every call is the identity outside a trial; see autotune.pipelines.script.api, where it lives (in the
pipelines layer, which a trial installs its settings into). A package of its own only so that a script's
import line stays short.

May import: autotune.pipelines.script.api only.
"""

from autotune.pipelines.script.api import accumulation, autocast, batch_size, data_seed, lr, model, scaler, seed

__all__ = ["accumulation", "autocast", "batch_size", "data_seed", "lr", "model", "scaler", "seed"]
