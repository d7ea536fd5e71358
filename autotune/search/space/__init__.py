"""The search space: its knob specs, read from YAML, resolved in one `resolve` against this machine,
the pipeline, the study's global batch and the memory estimate; configs suggested from it; the
hardware facts and the machine fingerprint a study's timings are tied to.

May import: autotune.core, autotune.trial, autotune.pipelines; nothing else of autotune.search.
"""
