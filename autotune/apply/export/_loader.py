"""The DataLoader a trial built and the micro-batch it yields, in every export's terms: the loader knobs'
own lines are their module's (core/knobs/loader.py); here the micro-batch beside them, and the diff's edits
of the script's own DataLoader(...) calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.config import TrialConfig
from autotune.core.knobs import loader
from autotune.pipelines import script

if TYPE_CHECKING:
    from autotune.apply.export.diff import Rewrite

# DataLoader's positional order (torch.utils.data.DataLoader.__init__), for a script that passes the
# loader knobs positionally; prefetch_factor and persistent_workers are keyword-only.
POSITION = {"batch_size": 1, "num_workers": 5, "pin_memory": 7}


# The comments beside a Lightning study's own dataloader_kwargs, as its trial passed them.
LIGHTNING_COMMENTS = {"batch_size": "per process"}


def kwargs(cfg: TrialConfig, indent: str = "    ") -> list[str]:
    """The DataLoader keyword arguments, one per line: Lightning's dataloader_kwargs and accelerate's script."""
    return [f"{indent}batch_size={cfg.batch_size!r},  # per process", *loader.kwargs_lines(cfg, indent)]


def changes(ran: dict[str, Any], own: dict[str, Any], no_effect: frozenset[str]) -> dict[str, Any]:
    """The loader arguments a trial ran that differ from the script's own in effect (prefetch None is 2
    with workers), less those that do nothing here; without workers, the script's own persistence and
    prefetch are turned off, which DataLoader requires."""
    out = {k: ran[k] for k in ("num_workers", "pin_memory") if k not in no_effect and ran.get(k) != own.get(k)}
    workers = ran.get("num_workers") or 0
    if not workers:
        if own.get("persistent_workers") is not False:
            out["persistent_workers"] = False
        if own.get("prefetch_factor") is not None:
            out["prefetch_factor"] = None
        return out
    if ran.get("persistent_workers") != own.get("persistent_workers"):
        out["persistent_workers"] = ran.get("persistent_workers")
    ran_prefetch, own_prefetch = (
        2 if p is None else p for p in (ran.get("prefetch_factor"), own.get("prefetch_factor"))
    )
    if ran_prefetch != own_prefetch:
        out["prefetch_factor"] = ran_prefetch
    return out


def _write(rw: Rewrite, src: Any, call: Any, knobs: dict[str, Any]) -> None:
    for name, value in knobs.items():
        rw.write(src, call, name, value, POSITION.get(name))


# A loader built where the diff edits nothing (a library): what `autotune run` does instead.
BY_RUN = "`autotune run` applies {what} there with no edit, through the same seams the trials used"


def _write_site(rw: Rewrite, site: Any, knobs: dict[str, Any]) -> None:
    """A loader's knobs at its site; for one a library builds (a file the diff does not edit), where the
    script's own call into the library passes them (`create_loader(num_workers=args.workers)`: the option's
    default, so its `-j` keeps working), and the rest said: `autotune run` applies them."""
    if site.src.editable or not knobs:
        _write(rw, site.src, site.call, knobs)
        return
    via = site.record.get("via")
    src = rw.source_at(str(via["file"])) if isinstance(via, dict) else None
    call = src.call_at(via) if src is not None and src.editable else None
    passed = {}
    if src is not None and call is not None:
        passed = {k: v for k, v in knobs.items() if src.argument(call, k, None) is not None}
        _write(rw, src, call, passed)
    if rest := {k: v for k, v in knobs.items() if k not in passed}:
        what = ", ".join(f"{k}={v!r}" for k, v in rest.items())
        rw.notes.append(
            f"{site.record.get('file')}:{site.record.get('line')}: the {site.record.get('type')} is built in a "
            f"library, which the diff does not edit, and the script's call passes no {', '.join(rest)}: "
            + BY_RUN.format(what=what)
        )


def script_lines(cfg: TrialConfig, skip: frozenset[str]) -> list[str]:
    """The script's DataLoader arguments, unless the script builds none."""
    return [] if "num_workers" in skip else loader.script_lines(cfg)


def edit(rw: Rewrite) -> None:
    """The loaders a trial iterated get the arguments it ran them with, where those differ from the script's
    own (a knob that does nothing on the machine measured is not one); the micro-batch where the trial
    handed it over there (the script calls no at.batch_size()), else at.batch_size() gets the measured
    default. Without a record of which loaders ran, every DataLoader(...) call in the script."""
    cfg = rw.cfg
    if not set(script.LOADER_KNOBS) & rw.skip:
        sites = rw.sites("loaders")
        if sites is None:
            ran = loader.arguments(cfg)  # what a trial that is not the baseline gives every DataLoader
            for call in rw.calls_to("DataLoader"):
                own = {k: rw.own(rw, call, k, loader.DEFAULTS[k], POSITION.get(k)) for k in ran}
                _write(rw, rw, call, changes(ran, own, rw.no_effect))
        for site in sites or []:
            if site.used():
                _write_site(rw, site, changes(site.record["ran"], site.record["own"], rw.no_effect))
    if "batch_size" in rw.skip or rw.job.own is None:
        return
    if rw.job.through_loader:  # where the trial handed it over: the DataLoaders built with the script's own
        sites = rw.sites("loaders")
        if sites is None:
            for call in rw.calls_to("DataLoader"):
                if rw.own(rw, call, "batch_size", 1, POSITION["batch_size"]) == rw.job.own[0] != cfg.batch_size:
                    _write(rw, rw, call, {"batch_size": cfg.batch_size})
        for site in sites or []:
            own, ran = site.record["own"].get("batch_size"), site.record["ran"].get("batch_size")
            if site.used() and own == rw.job.own[0] and ran != own:
                _write_site(rw, site, {"batch_size": ran})
        return
    for call in rw.api("batch_size"):
        if cfg.batch_size != rw.job.own[0]:
            rw.default(call, cfg.batch_size)
    flag = rw.job.batch_option
    if flag is not None and cfg.batch_size != rw.job.own[0]:  # its command line's option, not its source
        rw.flags[(flag.rstrip("="),)] = cfg.batch_size
        rw.notes.append(f"batch_size {cfg.batch_size}: run the script with {flag.rstrip('=')}={cfg.batch_size}")
