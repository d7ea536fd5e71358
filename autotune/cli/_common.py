"""What the commands share: the argparse parser that exits 2, and the workload flags."""
from __future__ import annotations

import argparse
import os

from autotune.core.errors import ExitCode


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors are bad input too: exit 2, one line
        self.exit(ExitCode.BAD_INPUT, f"autotune: error: {message} (see `{self.prog} --help`)\n")


def workload_args(p: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """--data, --image-size, --pipeline. `inherited`: the defaults come from a config file."""
    p.add_argument("--data", metavar="DIR", help="dataset folder, passed to the pipeline as data_dir: the unet "
                   "reads DIR/images and DIR/masks (default: " + ("the config's)" if inherited else
                   "a synthetic set generated once under studies/data)"))
    p.add_argument("--image-size", type=int, default=None, metavar="PX",
                   help="training crop size (default: " + ("the config's)" if inherited else "128)"))
    p.add_argument("--pipeline", default=None, metavar="MODULE:FACTORY",
                   help="training pipeline: 'unet' or an importable factory returning a Pipeline (default: "
                   + ("the config's)" if inherited else "unet)"))


def study_args(p: argparse.ArgumentParser, *, studies_dir: str | None = None) -> None:
    """--study and --storage for commands that read an existing study."""
    p.add_argument("--study", default="autotune", help="study name (default autotune)")
    p.add_argument("--storage", default=None, help="Optuna storage (default: the studies.db journal)")
    if studies_dir:
        p.add_argument("--studies-dir", default="studies", help=studies_dir)


def skip_bad_data_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip-bad-data", action="store_true", help="leave out data items that cannot be decoded "
                   "(and say how many) instead of refusing the data (exit 2)")


def apply_skip_bad_data(args: argparse.Namespace) -> None:
    """Trial and training processes read this when they build their data."""
    from autotune.pipelines import SKIP_BAD_DATA_ENV

    if getattr(args, "skip_bad_data", False):
        os.environ[SKIP_BAD_DATA_ENV] = "1"
