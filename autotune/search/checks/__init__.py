"""The checks: whether a faster config still trains like the baseline. Parity at equal samples for a
class that keeps the optimizer step, time to the baseline's loss for one that changes it, and one
check per training-math class, stored in the study so no class is checked twice.

May import: autotune.core, autotune.trial, autotune.pipelines, search.store, search.space, search.budget.
"""
