"""What users take away from a study: exports (one renderer per format), `train` (real epochs with a
config), `ablate` (each technique's contribution), `report` (one HTML file) and the leaderboard display.

May import: autotune.core, autotune.search, autotune.trial, autotune.pipelines.
"""
