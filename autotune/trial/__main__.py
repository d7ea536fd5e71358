"""`python -m autotune.trial`: one trial worker (one rank under torchrun)."""

import sys

from autotune.trial.loop.worker import main

sys.exit(main())
