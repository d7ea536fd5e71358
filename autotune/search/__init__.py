"""The control plane, one folder per idea, each using only the ones listed below it:

- `loop/`: a search's run. The session (open -> run -> finish, with its signal handling), the study it
  opens and the sampler and pruner it builds, admission before launch, the runner (one trial: launch,
  classify, tell), the strategy, confirmation and the parity gate at the end.
- `checks/`: whether a config trains like the baseline: parity at equal samples, time to target, and
  one check per training-math class.
- `store/`: what a study keeps and how it is read. Storages, the journal, the typed records in Optuna's
  attrs, the leaderboard and export order read from them, a fleet of workers, dead owners' trials.
- `space/`: what is searched. The space (reading the YAML, resolving it against the hardware, the
  pipeline, the global batch and memory in one `resolve`), suggesting configs, the hardware facts,
  the machine fingerprint and the memory estimate.
- `budget.py`: the one clock every phase asks what it may spend.

Optuna is used here and above, never below. May import: autotune.core, autotune.trial, autotune.pipelines.
"""
