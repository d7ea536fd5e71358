"""What runs inside a trial's process: the worker prepares the job for its kind and drives the one
measured loop with that kind's step (autotune's own over a Pipeline, built by the harness; a framework's
Trainer through a callback, `frameworks/`; a user's script through torch's hooks, `script`). The knobs
are applied here: to the process and model (`knobs`), the loader (`loading`), the sharding (`sharding`),
and the model a warm server draws once for every trial (`warm_model`). `outcome` maps what ended a run
(its exception) to one status and exit code, for the worker, the probes and the launcher.

May import: autotune.core, autotune.pipelines and trial.measurement.
"""
