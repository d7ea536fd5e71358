"""The data plane: one config -> one isolated, measured process. The launcher starts it (forked from the
warm server, plain, or under torchrun) and classifies how it ended; the worker (`python -m
autotune.trial`) builds the pipeline through the harness, applies the knobs and measures honestly. The probe
(`python -m autotune.trial.probe`) measures the model facts a memory estimate needs, once per study.

May import: autotune.core and autotune.pipelines. Never optuna: a trial knows nothing of the search.
"""
