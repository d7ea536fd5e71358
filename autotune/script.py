"""The cooperative API for a plain PyTorch script tuned by autotune: `from autotune import script as at`.

Every call is the identity outside a trial; see autotune.pipelines.script.api.
"""

from autotune.pipelines.script.api import autocast, model, scaler, seed

__all__ = ["autocast", "model", "scaler", "seed"]
