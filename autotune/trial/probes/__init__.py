"""The measuring runs that are not trials. Each is a process of its own, started by the launcher, that
builds the job as a trial does and writes one JSON result: `ceiling` (the compute-only rate on cached
batches beside the end-to-end one, and the device's peak) and `model_facts` (parameters and the
activations each stage saves, for the memory estimate). Each module holds both sides: `run_*`, which
the search calls, and `main`, the process's entry point.

May import: autotune.core, autotune.pipelines, trial.processes, trial.loop and trial.measurement.
"""
