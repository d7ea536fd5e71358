"""The data plane: one config -> one isolated, measured process. One folder per concept, each using only
the ones listed below it:

- `probes/`: the measuring runs that are not trials, each a process of its own that builds the job as a
  trial does: the compute-only ceiling (`python -m autotune.trial.probes.ceiling`) and the model facts a
  memory estimate needs (`python -m autotune.trial.probes.model_facts`).
- `processes/`: every fresh process a trial needs. The launcher (forked from the warm server, plain, or
  under torchrun, on this machine or across nodes through TorchX), the warm fork server and its
  children, the per-device and per-CPU locks.
- `loop/`: what runs inside a trial's process. The worker (`python -m autotune.trial`) prepares the job
  for its kind (autotune's own Pipeline through the harness, a framework's Trainer, a user's script) and
  drives the one measured loop with that kind's step; the knobs applied to the process, the model, the
  loader and the optimizer; sharding; the model a warm server draws once; how a run ended (`outcome`).
- `measurement/`: the instruments. The device clock read after a sync, memory and utilisation, effects
  observed in the process, contention from other processes.

May import: autotune.core and autotune.pipelines. Never optuna: a trial knows nothing of the search.
"""
