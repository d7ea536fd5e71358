"""The control plane: the search space, the search session (open -> run -> finish, with its signal
handling), the one `Budget` every phase asks, the Optuna study and its typed records, storages, the
machine fingerprint, the per-device locks and the memory estimate before launch; `finish/` holds the end of a search (confirmation, the
parity gate). Optuna is used here and above, never below.

May import: autotune.core, autotune.trial, autotune.pipelines.
"""
