"""The measuring runs that are not trials. Each is a process of its own, started by the launcher, that
writes one JSON result: `ceiling` (the job built as a trial builds it: the compute-only rate on cached
batches beside the end-to-end one, and the device's peak), `model_facts` (parameters and the activations
each stage saves, for the memory estimate) and `alone` (a user's script run as written, with no knob of
autotune's: a fixed warm-up, then timed optimizer steps). Those that time steps drive the one Clock
trials drive (trial.measurement.clock: the ceiling one per phase, `alone` one from its step hook), so
their warm-up, windows, syncs and sample counts are a trial's. Each module holds both sides: `run_*`,
which the search calls, and `main`, the process's entry point.

May import: autotune.core, autotune.pipelines, trial.processes, trial.loop and trial.measurement.
"""
