"""The native config file: `Export` (everything best.yaml says about one config), its YAML
rendering, and `load_config`, which reads a flat TrialConfig or an exported file back.

Only `config:` and `workload:` are read back; the other sections record what was measured.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Mapping

import yaml

from autotune.core.config import KNOBS, TrialConfig, bare_off, baseline_of
from autotune.core.result import TrialResult
from autotune.core.errors import ConfigError
from autotune.core.paired import spread
from autotune.core.urls import mask_url

# The headline figures, in the order a reader wants them; any other metric follows these.
METRIC_KEYS = ("samples_per_s", "step_time_p50", "peak_memory_bytes", "data_wait_fraction")

DEFAULT_REPRODUCE = "autotune trial --config best.yaml"


@dataclass(frozen=True)
class Export:
    """Everything an exported file says about one configuration. Built once, rendered many ways."""

    config: TrialConfig
    metrics: dict[str, Any] = field(default_factory=dict)
    baseline_samples_per_s: float | None = None
    speedup: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    # name, trial number, storage. The caller masks the storage URL; to_yaml masks it again because
    # a leaked password in a file people share is worse than masking twice.
    study: dict[str, Any] = field(default_factory=dict)
    reproduce: str = DEFAULT_REPRODUCE
    # The confirmation rounds this winner came out of (medians, ranges, whether the order changed);
    # None when the search was not confirmed, and then best.yaml has no `confirmed:` section.
    confirmed: dict[str, Any] | None = None
    # The configs faster than this one that it was chosen over, each with why (no measurable gain in its
    # rounds; training math that differs and was not checked); None: none was.
    passed_over: list[dict[str, Any]] | None = None
    # A script study's last word (search/store/last_word.py): the script as written against this export applied,
    # each run alone in paired rounds, their figure and its sign-test interval, the search's figures beside
    # it, or why it did not run; None: not a script study, or its best is the script as written.
    alone: dict[str, Any] | None = None
    # How its training differs from the baseline's (core/training.py section()), and the parity
    # check's verdict (search/checks/parity.py); None: not known, and the section is left out.
    training_math: dict[str, Any] | None = None
    parity: Mapping[str, Any] | None = None
    # The study's training-math classes and their one check each, the trials spent in classes that
    # failed, and the time spent checking (search/checks/classes.py summary()); None: none was checked.
    checks: dict[str, Any] | None = None
    # A framework pipeline's (--pipeline lightning:... / hf:...) tuned settings as the trial passed them:
    # the Trainer's keyword arguments, or the TrainingArguments fields that differ from the user's base.
    framework: dict[str, Any] | None = None
    # How far it is from the limit (trial/probes/ceiling.py): its compute-only rate on cached batches beside the
    # end-to-end one, the share lost to data wait, and its model FLOPs utilisation against a probed peak,
    # each with how it was measured; {"skipped": why} when the budget could not pay for it; None: not run.
    ceiling: dict[str, Any] | None = None
    # A script study's DataLoader and optimizer construction sites, as its trial recorded them
    # (trial/loop/script/sites.py: file, line, the script's own arguments, what ran, whether it was iterated or
    # stepped), for the diff to edit only those; None: not recorded (a study made before it was).
    sites: Mapping[str, Any] | None = None
    # The baseline's draws in the search, each its own process (search/loop/draws.py): their spread is the
    # machine's run-to-run noise for one config; None: one draw.
    baseline_draws: list[float] | None = None

    @classmethod
    def from_result(
        cls,
        config: TrialConfig,
        result: TrialResult,
        *,
        baseline_samples_per_s: float | None = None,
        environment: Mapping[str, Any] | None = None,
        study: Mapping[str, Any] | None = None,
        reproduce: str = DEFAULT_REPRODUCE,
    ) -> Export:
        """Build from a measured TrialResult; the speedup is only stated when both figures are real."""
        metrics = {k: getattr(result, k) for k in METRIC_KEYS}
        said = result.applied.get("throughput")  # a script's trial says what its figure counts
        if isinstance(said, Mapping) and said.get("unit"):
            metrics["throughput_unit"] = f"{said['unit']}: {said.get('why', '')}".rstrip(": ")
        sps = result.samples_per_s
        speedup = None
        if _positive(sps) and _positive(baseline_samples_per_s):
            speedup = float(sps) / float(baseline_samples_per_s)  # type: ignore[arg-type]
        env = {"device": result.device, "world_size": result.world_size, **dict(environment or {})}
        framework = result.applied.get("framework")
        sites = (result.applied.get("script") or {}).get("sites")
        return cls(
            config,
            metrics,
            baseline_samples_per_s,
            speedup,
            env,
            dict(study or {}),
            reproduce,
            framework=dict(framework) if isinstance(framework, Mapping) else None,
            sites=sites if isinstance(sites, Mapping) else None,
        )


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


_YAML_HEADER = """\
# autotune export: the fastest configuration measured for this pipeline on this machine.
# Apply it:
#   autotune trial --config best.yaml    # re-measure it here
#   autotune train --config best.yaml    # train with it
#   autotune run --config best.yaml train.py ARGS   # a script study: your script, trained as measured
# Only `config:` and `workload:` are read back; the other sections record what was measured.
# Framework settings: autotune export --format lightning | hf | accelerate
"""


def _plain(x: Any) -> Any:
    """Reduce a value to what yaml.safe_dump can write (it refuses tuples, paths, numpy scalars)."""
    if isinstance(x, str):
        return str(x)  # a stored word (core/outcomes.py) as its plain string
    if x is None or isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_plain(v) for v in x]
    item = getattr(x, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return _plain(item())
        except (TypeError, ValueError):
            pass
    return str(x)


def _section(key: str, value: Any) -> str:
    return yaml.safe_dump({key: _plain(value)}, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _draws(draws: list[float] | None) -> dict[str, Any]:
    """best.yaml's record of the baseline's draws in the search: each figure, and their spread around their
    median (the machine's run-to-run noise for one config); nothing for one draw."""
    if not draws or len(draws) < 2:
        return {}
    low, high = spread(draws)
    return {
        "search_draws": [round(x, 4) for x in draws],
        "noise": f"x{low:.3f}..x{high:.3f} of their median: each draw its own process",
    }


def to_yaml(e: Export) -> str:
    """The native format. Sections are dumped one by one so the file reads with a blank line between them."""
    metrics = {k: e.metrics.get(k) for k in METRIC_KEYS}
    metrics.update({k: v for k, v in e.metrics.items() if k not in metrics})
    study = dict(e.study)
    if isinstance(study.get("storage"), str):
        study["storage"] = mask_url(study["storage"])
    sections = [
        ("config", e.config.knobs()),  # KNOBS order: the contract shared with search spaces
        ("workload", e.config.workload()),
        ("metrics", metrics),
        ("baseline", {"samples_per_s": e.baseline_samples_per_s, **_draws(e.baseline_draws)}),
        ("speedup", e.speedup),
        *([("alone", e.alone)] if e.alone else []),
        *([("confirmed", e.confirmed)] if e.confirmed else []),
        *([("passed_over", e.passed_over)] if e.passed_over else []),
        *([("training_math", e.training_math)] if e.training_math else []),
        *([("parity", e.parity)] if e.parity else []),
        *([("checks", e.checks)] if e.checks else []),
        *([("framework", e.framework)] if e.framework else []),
        *([("ceiling", e.ceiling)] if e.ceiling else []),
        # Where the script built its loaders and optimizers: `autotune run` applies the loader knobs there.
        *([("sites", e.sites)] if e.sites else []),
        ("environment", e.environment),
        ("study", study),
        ("reproduce", e.reproduce),
    ]
    return _YAML_HEADER + "\n" + "\n".join(_section(k, v) for k, v in sections)


def load_config(path: str | os.PathLike[str]) -> TrialConfig:
    """Read a flat TrialConfig (YAML or JSON) or an exported file. Every failure is one ConfigError line naming the file."""
    p = Path(path)
    data = _read_mapping(p.suffix.lower() == ".json", _read_text(p), str(p))
    try:
        return TrialConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a value of the wrong type that a comparison tripped on
        raise ConfigError(f"{p}: bad config value: {exc}") from None


def load_sites(path: str | os.PathLike[str]) -> Mapping[str, Any] | None:
    """An exported file's `sites:` (a script study's DataLoader and optimizer construction sites, as its
    trial recorded them); None when it has none (another pipeline's, or a study made before them)."""
    p = Path(path)
    sites = _read_mapping(p.suffix.lower() == ".json", _read_text(p), str(p)).get("sites")
    return sites if isinstance(sites, Mapping) else None


def load_baseline(arg: str, workload: TrialConfig) -> dict[str, Any]:
    """--baseline: the knobs the user trains with today, as inline JSON or a YAML/JSON file in best.yaml's
    format (its `config:` section) or a flat mapping of knobs. Checked as `workload`'s baseline would run;
    every failure is one ConfigError line."""
    inline = arg.lstrip().startswith("{")
    where = "--baseline" if inline else f"--baseline {arg}"
    data = (
        _read_mapping(True, arg, where)
        if inline
        else _read_mapping(arg.lower().endswith(".json"), _read_text(Path(arg)), where)
    )
    knobs = dict(data["config"]) if isinstance(data.get("config"), Mapping) else dict(data)
    unknown = sorted(str(k) for k in knobs if k not in KNOBS)
    if unknown:
        raise ConfigError(f"{where}: unknown knob(s) {', '.join(unknown)} (knobs are: {', '.join(KNOBS)})")
    try:
        baseline_of(workload.replace(baseline=knobs))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: bad knob value: {exc}") from None
    return knobs


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config: {getattr(exc, 'strerror', None) or exc}") from None


def _read_mapping(is_json: bool, text: str, where: str) -> Mapping[str, Any]:
    data: Any
    if is_json:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    else:
        try:
            data = yaml.safe_load(text)  # never yaml.load: a config file must not run code
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, Mapping):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{where}: a config must be a mapping of knob: value, got {got}")
    return _fix_yaml_off(data)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} (line {mark.line + 1})" if mark is not None else str(problem)


def _fix_yaml_off(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """YAML 1.1 reads a hand-written bare `compile: off` as False; that can only have meant 'off'."""

    def fix(d: Mapping[str, Any]) -> Mapping[str, Any]:
        return {k: bare_off(k, v) for k, v in d.items()}

    if isinstance(data.get("config"), Mapping):
        return {**data, "config": fix(data["config"])}
    return fix(data)
