"""The control plane: the search space, the search session (open -> run -> confirm -> finish, with its
signal handling), the Optuna study and its typed trial records, storages, the machine fingerprint and
the per-device locks. Optuna is used here and above, never below.

May import: autotune.core, autotune.trial, autotune.pipelines.
"""
