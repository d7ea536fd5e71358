"""The study store: what a study keeps and how it is read back. Storages (a journal file by default,
any Optuna URL), the typed records kept in Optuna's user attrs (one place spells each key), the
leaderboard, baseline and export order read from them, the one path that tells Optuna how a trial
ended (telling), a fleet of workers sharing one study, and the trials a dead controller left running.

May import: autotune.core, autotune.trial, autotune.pipelines, search.space.
"""
