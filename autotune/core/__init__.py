"""The core every other layer stands on: the frozen records that cross every boundary (`TrialConfig`,
`TrialResult`, `SearchSettings`), the record a trial keeps of each knob's effect and its one refusal of a
knob a job cannot honour (`effects`), the errors with their one exit-code table, config-file I/O (the
native best.yaml, read and written), atomic writes, masked URLs, process-group helpers and the count of
usable CPUs (affinity, cgroup quota).

May import: the standard library and yaml. Nothing else of autotune, never torch or optuna.
"""
