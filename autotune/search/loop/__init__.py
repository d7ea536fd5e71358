"""A search's run: the session (open -> run -> finish), the study it opens with the sampler and pruner
it builds, admission (the one decision whether a proposal runs), the runner (launch one trial, classify
it, tell Optuna), the strategy, and the end of the search (confirmation rounds, the parity gate, the
export's ceiling; then the export).

May import: everything else of autotune.search, and autotune.core, autotune.trial, autotune.pipelines.
"""
