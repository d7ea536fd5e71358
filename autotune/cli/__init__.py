"""`autotune` commands: thin ones. Each parses its arguments, calls one function of the layers below,
and returns an exit code. This package is the only reader of argv and the only place an
AutotuneError becomes exit code 2 (one line, no traceback).

May import: everything in autotune.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from autotune.cli import knobs, run, search, storage_proxy, study
from autotune.cli._common import Parser
from autotune.core.errors import AutotuneError, ExitCode
from autotune.core.files import disk_error, path_error

EXIT_CODES = (
    "exit codes: 0 ok, 2 bad input or bad data (one line, no traceback, nothing written), 130 interrupted, "
    "1 unexpected; `trial` and `train` add 3 out of memory, 4 non-finite loss, 5 knob unsupported here"
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="autotune", description="Find the fastest way to train a PyTorch model on this machine.", epilog=EXIT_CODES
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in (search, storage_proxy, knobs, run, study):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AutotuneError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except OSError as e:
        # A path the user named that cannot be used (a file where a folder goes, a full or read-only
        # disk) and that no command checked up front: still bad input, one line. Anything else is a bug.
        if e.filename is None or not (path_error(e) or disk_error(e)):
            raise
        print(f"autotune: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
