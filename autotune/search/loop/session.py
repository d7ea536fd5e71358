"""A search session: open -> run -> finish, with its own signal handling.

`autotune search` and `autotune worker` are two thin callers: `SearchSession.create` validates
everything and creates (or resumes) the study; `SearchSession.join` attaches to one a search created.
`run` installs SIGINT/SIGTERM handlers (both stop the current trial, which is recorded as
interrupted), runs trials until the budget or --n-trials is spent, exports the best so far even
after an interrupt, and restores the previous handlers in `finally`, however autotune was started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Collection, Iterator

import optuna

from autotune import pipelines
from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.core.configfile import to_yaml
from autotune.core.errors import AutotuneError, ExitCode
from autotune.core.files import disk_error, write_atomic
from autotune.core import outcomes
from autotune.core.outcomes import Reason, Role
from autotune.search.store import _optuna, fleet, records
from autotune.search.checks import classes
from autotune.search.loop import finish
from autotune.search.space import memory
from autotune.search.budget import Budget
from autotune.search.space.machine import differences, fingerprint
from autotune.search.store.folders import end_folder
from autotune.search.store.records import ConfirmationSummary, StudyRecord, TrialRecord
from autotune.search.store.results import best_export, leaderboard
from autotune.search.loop.runner import Events, measured, reuse, run_one
from autotune.search.loop import admission
from autotune.search.loop.admission import Limits, Sizer
from autotune.search.loop.proposals import Proposals
from autotune.search.loop.strategy import CoordinateSampler
from autotune.search.space.memory import stored_fit
from autotune.search.space.spec import DEFAULT_SPACE, SearchSpace
from autotune.search.space.resolve import resolve
from autotune.search.space.reading import load_space
from autotune.search.store.storage import check_writable, open_storage
from autotune.search.loop.study import config_for, enqueue_starts, load_study, open_study, study_workload
from autotune.search.store.liveness import fail_stale
from autotune.trial.processes.placement import Placement
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer, WarmServerError

Say = Callable[[str], None]
Progress = Callable[[int, int], None]
# Trials that fail on the data in a row before the search stops: every config would fail the same way. So
# would every config after as many failing with one message before any trial was measured (a script that
# raises before its first step, a pipeline that cannot build its model).
DATA_FAILURES_TO_STOP = 3
# Failures that say nothing of the config's code path: not counted as "the same failure again".
CIRCUMSTANTIAL = frozenset({Reason.TIMEOUT, Reason.BUDGET, Reason.INTERRUPTED, Reason.STALE, Reason.DISK})
# Proposals of already-measured configs in a row before the search ends: a small space is exhausted.
REPEATS_TO_STOP = 25
# "0" skips the memory estimate (its probe is one more process that imports torch, at every start).


@dataclass
class Outcome:
    """How a run ended: the trials it ran, whether it was interrupted, and the exported best."""

    trials: int = 0
    interrupted: bool = False
    best_yaml: Path | None = None
    error: str | None = None  # why the run stopped early (a full disk, bad data), in one line
    code: int = ExitCode.OK
    confirmation: ConfirmationSummary | None = None  # search/loop/confirm.py summarize(); None when not run


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class SearchSession:
    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        settings: SearchSettings,
        *,
        warm: bool = True,
        say: Say = print,
        fit: memory.Fit | None = None,
    ) -> None:
        self.study, self.space, self.settings = study, space, settings
        self.sizer = Sizer(fit, say)  # each proposal's memory estimate, before launch
        # Proposals that would not be run are drawn again before they become trials (proposals.py).
        inner = study.sampler.inner if isinstance(study.sampler, Proposals) else study.sampler
        self.proposals = Proposals(inner, space, settings.base)
        study.sampler = self.proposals
        self.warm, self.say = warm, say
        self._data_failures = 0
        self._same_failures: tuple[int, tuple[str, str] | None] = (0, None)  # how many in a row, of what
        self._stopped: str | None = None
        self._deferred = False  # the last proposal told unrun was deferred: the budget left is too short
        self.fleet_key: str | None = None  # a worker of a fleet: only the last one to finish confirms

    # ---- open -----------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        settings: SearchSettings,
        *,
        warm: bool = True,
        say: Say = print,
        defer: bool = False,
        progress: Progress | None = None,
    ) -> SearchSession:
        """Validate the space, pipeline and storage, then create or resume the study. Anything wrong
        is an AutotuneError (exit 2) raised before the study is touched. defer (`--create-only`): the
        space is resolved, and the study fingerprinted, by the first worker on its own hardware."""
        space = load_space(settings.space or DEFAULT_SPACE)
        pipeline = pipelines.load_pipeline(settings.base)
        # A framework job's baseline is the user's own settings, not plain PyTorch: the speedup is over them.
        if settings.base.baseline is None and (own := pipelines.own_baseline(pipeline, settings.base.global_batch)):
            settings = dataclasses.replace(settings, base=settings.base.replace(baseline=own))
            say("baseline: your job as written: " + ", ".join(f"{k} {v}" for k, v in own.items()))
        # defer: the database host may not hold the data, nor the workers' hardware.
        # Decode the data once before the first trial (if the pipeline can): bad items are bad input.
        if not defer and (
            note := pipelines.validate_data(pipeline, skip_bad=settings.skip_bad_data, progress=progress)
        ):
            say(note)
        check_writable(settings.storage, settings.studies_dir)  # a full disk stops here, before any trial
        hw, fit = None, None
        if not defer:
            space, hw, fit = resolve(space, pipeline, settings, settings.base, say)
        fp = fingerprint(settings.base) if hw is not None else {}
        study = open_study(settings, open_storage(settings.storage), fp, space, hw)
        if fit is not None:
            records.write_model_facts(study, fit.facts.to_dict())
        return cls(study, space, settings, warm=warm, say=say, fit=fit)

    @classmethod
    def join(
        cls,
        settings: SearchSettings,
        data: str | None,
        *,
        warm: bool = True,
        say: Say = print,
        progress: Progress | None = None,
        allowed: Collection[str] | None = None,
    ) -> SearchSession:
        """Attach to a study made by `autotune search`: its space, workload and trial timeout come from it.
        With `allowed` (`autotune worker` passes its own --pipeline values), the study's pipeline must be
        one of them: checked on the study as loaded here, before anything it names is imported. A caller
        of this function that passes none already runs code of its choosing."""
        study = load_study(settings.storage, settings.study)
        if allowed is not None:  # before anything is written, too: a refused study leaves no trace
            fleet.check_pipeline(study, allowed)
        check_writable(settings.storage, settings.studies_dir)
        record = StudyRecord.of(study)
        if record.space is None:
            raise AutotuneError(f"study {settings.study!r} was not created by `autotune search` (no space attr)")
        base = study_workload(study, data, settings.studies_dir)
        pipeline = pipelines.load_pipeline(base)  # a module this machine can't import is bad input
        # Decode the data once before the first trial (if the pipeline can): bad items are bad input.
        if note := pipelines.validate_data(pipeline, skip_bad=settings.skip_bad_data, progress=progress):
            say(note)
        space = SearchSpace.from_dict(record.space)
        if not record.resolved and _claim(study):  # the first worker of a `--create-only` study decides
            space, hw, fit = resolve(space, pipeline, settings, base, say)
            if fit is not None:  # before `resolved`: the workers waiting for it read the facts next
                records.write_model_facts(study, fit.facts.to_dict())
            dataclasses.replace(record, space=space.to_dict(), fingerprint=fingerprint(base), resolved=True).write(
                study
            )
            enqueue_starts(study, base, space, hw)
        record = _resolved(study)
        space = SearchSpace.from_dict(record.space or {})
        diff = differences(record.fingerprint, fingerprint(base))
        if diff and not settings.force:
            raise AutotuneError(
                f"this machine differs from study {settings.study!r}'s ({'; '.join(diff)}); "
                "its timings would not be comparable (--force to join anyway)"
            )
        timeout = settings.trial_timeout_s or record.trial_timeout_s
        settings = dataclasses.replace(
            settings,
            base=base,
            trial_timeout_s=timeout,
            **{
                k: getattr(record, k)
                for k in ("memory_headroom", "parity_steps", "confirm_rounds", "confirm_top")
                if getattr(record, k) is not None
            },
        )
        session = cls(study, space, settings, warm=warm, say=say, fit=stored_fit(record, settings.memory_headroom))
        session.fleet_key = fleet.register(study)
        return session

    # ---- run ------------------------------------------------------------------------------------

    def run(self, events: Events | None = None, budget: Budget | None = None) -> Outcome:
        """Trials until the budget or --n-trials is spent, then the best so far exported. Ctrl-C and
        SIGTERM stop the current trial (recorded FAIL, interrupted) and still export. `budget`: the run's
        one clock, when the caller started it already (the live display shows it); else it starts now."""
        outcome = Outcome()
        if self.settings.skip_bad_data:  # trial processes (cold or forked) read it when they build the data
            pipelines.skip_bad_data_in_trials()
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
        s = self.settings
        budget = budget or Budget.of(s)
        note = finish.reserve_note(s, budget)
        if note:
            self.say(note)
        try:
            with self._warm_server() as server:
                for _ in self._trials(events or Events(), server, budget):
                    outcome.trials += 1
                _say_waiting_retries(self.study, self.say)
                if finish.wanted(s) and not self._stopped and self._finishes():
                    outcome.confirmation = finish.run(self.study, s, budget, server=server, say=self.say)
        except KeyboardInterrupt:
            outcome.interrupted = True
        except OSError as e:
            if not disk_error(e):
                raise
            outcome.error = f"cannot write {e.filename or 'the study'}: {e.strerror or e}; the search stopped"
            outcome.code = ExitCode.ERROR
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        try:
            outcome.best_yaml = self.finish()
        except OSError as e:
            if not disk_error(e):
                raise
            outcome.error = (outcome.error or "") + f"; best.yaml not written: {e.strerror or e}"
            outcome.code = ExitCode.ERROR
        if self._stopped and not outcome.error:
            outcome.error, outcome.code = self._stopped, ExitCode.BAD_INPUT
        if outcome.interrupted and not outcome.error:
            outcome.code = ExitCode.INTERRUPTED
        return outcome

    def _trials(self, events: Events, server: WarmServer | None, budget: Budget) -> Iterator[optuna.trial.FrozenTrial]:
        """ask -> run -> tell, one trial at a time, while the median trial so far still fits in the
        budget less what the end of the search will need."""
        s = self.settings
        budget = budget.trials_begin()  # the warm server is up: its start-up is not the trials' time
        if isinstance(self.proposals.inner, CoordinateSampler):  # the pass prices its moves against what is left
            self.proposals.inner.budget_left = budget.search_left
            self.proposals.inner.check_reserve = budget.parity_reserve_s
        durations: list[float] = []
        repeats = 0
        while s.n_trials is None or len(durations) < s.n_trials:
            left = budget.search_left()
            if budget.trials_over(left, durations):
                break
            if self.fleet_key is not None:
                fleet.beat(self.study, self.fleet_key)
            if _optuna.heartbeats(self.study):
                optuna.storages.fail_stale_trials(self.study)  # a dead worker's trial: FAIL, then retried
            else:
                fail_stale(self.study)  # journal: owner pid/host/heartbeat in user attrs
            limits = Limits(s.trial_timeout, budget.trial_timeout(left))
            self.proposals.screen = admission.screen(self.study, self.sizer, s.base, limits)
            if self._nothing_left():
                return
            trial = self.study.ask()
            cfg = config_for(trial, self.space, s.base)
            if self._told_unrun(trial, cfg, events, limits):
                if self._deferred:  # the sampler's draws, all screened, left only configs too long for now
                    self.say(
                        f"autotune: trial {trial.number} was deferred, as were the sampler's other proposals: what "
                        "it proposes needs more time than this run has left, so the search ends here"
                    )
                    return
                repeats += 1
                if repeats >= REPEATS_TO_STOP:
                    self.say(
                        f"autotune: the sampler proposed only configs already measured, in a failed class or "
                        f"too big for memory, {repeats} times in a row: the space looks exhausted, so the "
                        "search ends here"
                    )
                    return
                continue
            repeats = 0
            t0 = time.monotonic()
            frozen = run_one(self.study, trial, cfg, s, budget.trial_timeout(left), events, server)
            durations.append(time.monotonic() - t0)
            events.finished(frozen)
            self.sizer.calibrate(frozen)
            _retry_if_contended(self.study, frozen)
            classes.check_if_it_matters(
                self.study, s, frozen, end_folder(s, self.study, "parity"), server, self.say, budget
            )
            yield frozen
            if self._stop_for_data(frozen) or self._stop_for_failures(frozen):
                return

    def _nothing_left(self) -> bool:
        """Whether a space small enough to list has no config left that would be run now (and no queued
        trial waits): said, with why, and the search ends without asking for a trial it would write off."""
        left = self.proposals.left()
        if (
            left is None
            or left[None]
            or self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        ):
            return False
        counts = ", ".join(f"{n} {why}" for why, n in sorted(left.items(), key=lambda kv: str(kv[0])))
        total = sum(left.values())
        if left[admission.DEFERRED]:
            self.say(
                f"autotune: none of the space's {total} configs left would finish in the time this run has left "
                f"({counts}); those deferred may run in a longer run of this study: the search ends here"
            )
        else:
            self.say(
                f"autotune: the space is exhausted: each of its {total} configs was run or cannot be "
                f"({counts}), so the search ends here"
            )
        return True

    def _told_unrun(self, trial: optuna.Trial, cfg: TrialConfig, events: Events, limits: Limits) -> bool:
        """Tell a proposal without running it, when its class failed its check, it was measured already, its
        memory estimate exceeds what is usable, or its cost estimate the time it would be given; else
        record its estimates and return False (run it)."""
        self._deferred = False
        role = TrialRecord.of(trial).role
        label = classes.label_of(self.study, cfg) if role == Role.SEARCH else None
        verdict = classes.failed(self.study, label)
        if verdict is not None:  # its training math failed its check: told infeasible, not run
            events.finished(classes.write_off(self.study, trial, cfg, label, verdict))  # type: ignore[arg-type]
            return True
        earlier = measured(self.study, cfg) if role == Role.SEARCH else None
        if earlier is not None:
            events.finished(reuse(self.study, trial, earlier))
            return True
        if self.sizer.writes_off(self.study, trial, cfg, role, events):
            return True
        short = admission.cost_writes_off(self.study, trial, cfg, role, limits, events)
        self._deferred = short == admission.DEFERRED
        return short is not None

    def _finishes(self) -> bool:
        """`search` finishes its own run; a fleet's worker only when it is the last one still running."""
        if self.fleet_key is None:
            return True
        if fleet.finishes(self.study, self.fleet_key):
            return True
        self.say("autotune: other workers are still running: the last one to finish confirms the winner")
        return False

    def _stop_for_data(self, frozen: optuna.trial.FrozenTrial) -> bool:
        """Every config fails the same way on bad data: stop after a few in a row, and say why."""
        record = TrialRecord.from_frozen(frozen)
        self._data_failures = self._data_failures + 1 if record.reason == Reason.DATA else 0
        if self._data_failures < DATA_FAILURES_TO_STOP:
            return False
        self._stopped = (
            f"{DATA_FAILURES_TO_STOP} trials in a row failed on the data ({record.message}); fix the "
            "data, or pass --skip-bad-data to leave undecodable items out"
        )
        return True

    def _stop_for_failures(self, frozen: optuna.trial.FrozenTrial) -> bool:
        """Before any trial is measured, the same failure (reason and message) again and again is the job's,
        not a config's: stop after a few in a row, with it and what to do, rather than fail every config."""
        record = TrialRecord.from_frozen(frozen)
        ran_and_failed = records.outcome(frozen) in (outcomes.Outcome.FAILED, outcomes.Outcome.INFEASIBLE)
        cause = (str(record.reason), record.message) if ran_and_failed and record.reason not in CIRCUMSTANTIAL else None
        count, last = self._same_failures
        self._same_failures = (count + 1 if cause == last else 1, cause) if cause else (0, None)
        if self._same_failures[0] < DATA_FAILURES_TO_STOP or leaderboard(self.study):
            return False
        spec = self.settings.base.pipeline
        alone = f" (run it alone to see: python {spec[len('script:') :]})" if spec.startswith("script:") else ""
        self._stopped = (
            f"{DATA_FAILURES_TO_STOP} trials in a row failed the same way before any was measured "
            f"({record.reason}: {record.message.splitlines()[0] if record.message else 'no message'}): every "
            f"config would: fix the job{alone}, then search again"
        )
        return True

    def _warm_server(self) -> Any:
        """Trials fork from a process that imported torch and the pipeline once (fast start-up). Not when
        trials span nodes: each starts under the node launcher, so a server here would only idle."""
        if not self.warm or Placement.from_env().nodes > 1:
            return contextlib.nullcontext(None)
        try:
            return WarmServer.start(preload=(*DEFAULT_PRELOAD, *pipelines.preload_modules(self.settings.base.pipeline)))
        except WarmServerError as e:
            self.say(f"autotune: warm start unavailable, trials start cold: {e}")
            return contextlib.nullcontext(None)

    # ---- finish ---------------------------------------------------------------------------------

    def finish(self) -> Path | None:
        """Export the best feasible trial to studies/<study>/best.yaml; None if no trial finished."""
        if not leaderboard(self.study):
            return None
        out = Path(self.settings.studies_dir) / self.study.study_name / "best.yaml"
        export = best_export(self.study, self.settings.storage, out)
        write_atomic(out, to_yaml(export))
        return out

    @property
    def searched(self) -> tuple[str, ...]:
        return tuple(self.space.searched())


def _retry_if_contended(study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> None:
    """A figure measured while other processes used the CPU is not the config's speed: queue the same
    config once more (any worker of the study may take it). Its first figure ranks below every clean
    one meanwhile (results.leaderboard), so it never becomes the best on a starved measurement."""
    record = TrialRecord.from_frozen(frozen)
    if record.contended and record.retry_of is None and frozen.state == optuna.trial.TrialState.COMPLETE:
        records.enqueue(
            study, frozen.params, TrialRecord(role=record.role, config=record.config, retry_of=frozen.number)
        )


def _say_waiting_retries(study: optuna.Study, say: Say) -> None:
    """Re-measurements of contended trials that the budget left queued: said, never left unseen."""
    waiting = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        if TrialRecord.from_frozen(t).retry_of is not None
    ]
    if waiting:
        firsts = ", ".join(str(TrialRecord.from_frozen(t).retry_of) for t in waiting)
        say(
            f"autotune: {len(waiting)} re-measurement(s) of contended trial(s) {firsts} still wait in the study: the "
            "budget ended first. Their first figures rank below every clean one; the next search or worker on "
            "this study runs them first. Give each worker on a shared machine its own CPUs (--cpus)."
        )


def _claim(study: optuna.Study) -> bool:
    """Elect one resolver among workers joining a deferred study at once (fleet.claim)."""
    won = fleet.claim(study, records.RESOLVER, f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:12]}")
    return won is not None and not StudyRecord.of(won).resolved


def _resolved(study: optuna.Study, timeout_s: float = 120.0) -> StudyRecord:
    """The study's record once some worker has resolved it (at once when it already is)."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = StudyRecord.of(fleet.fresh(study))
        if record.resolved or time.monotonic() > deadline:
            return record
        time.sleep(0.5)
