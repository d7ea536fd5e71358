"""nanoGPT's configurator, as its train.py runs it (exec): each `--key=value` argument overrides the global of
that name, and a bare argument names a config file whose lines do. What autotune's source scan cannot follow."""

import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if "=" not in arg:
        exec(open(arg).read())  # a config file
    else:
        key, val = arg[2:].split("=", 1)
        assert key in globals(), f"unknown config key {key}"
        try:
            globals()[key] = literal_eval(val)
        except (SyntaxError, ValueError):
            globals()[key] = val
