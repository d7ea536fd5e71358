"""A search session: open -> run -> finish, with its own signal handling.

`autotune search` and `autotune worker` are two thin callers: `SearchSession.create` validates
everything and creates (or resumes) the study; `SearchSession.join` attaches to one a search created.
`run` installs SIGINT/SIGTERM handlers (both stop the current trial, which is recorded as
interrupted), runs trials until one of the stops (`Stop`) ends them, confirms and gates the winner
(search/loop/finish.py), exports the best so far even after an interrupt (`export_best`), and restores
the previous handlers in `finally`, however autotune was started. Why the trials stopped is said and
stored on the study (StudyRecord.stop_reason).
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
from autotune.core.settings import SearchSettings
from autotune.core.config import TrialConfig
from autotune.core.configfile import to_yaml
from autotune.core.errors import AutotuneError, ExitCode
from autotune.core.files import disk_error, write_atomic
from autotune.core.outcomes import Role, Verdict
from autotune.search.store import _optuna, fleet, records
from autotune.search.checks import classes, riding
from autotune.search.loop import alone, draws, finish, stops, trial0
from autotune.search.loop.stops import Stop
from autotune.search.space import memory
from autotune.search.budget import Budget
from autotune.search.space.machine import differences, fingerprint
from autotune.search.store.folders import end_folder, trial_dir
from autotune.search.store.records import ConfirmationSummary, StudyRecord, TrialRecord
from autotune.search.store.results import baseline_trial, best_export, class_label, leaderboard
from autotune.search.loop.runner import Events, run_one
from autotune.search.loop import admission
from autotune.search.loop.admission import Admission, Limits, Sizer
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


@dataclass
class RunReport:
    """How a run ended: the trials it ran, why they stopped, whether it was interrupted, and the exported best."""

    trials: int = 0
    stop: Stop | None = None
    interrupted: bool = False
    best_yaml: Path | None = None
    error: str | None = None  # why the run stopped early (a full disk, bad data), in one line
    code: int = ExitCode.OK
    confirmation: ConfirmationSummary | None = None  # search/loop/confirm.py summarize(); None when not run
    alone: dict[str, Any] | None = None  # a script study's alone rounds (search/loop/alone.py); None: not run


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
        self.stop: Stop | None = None  # why the last run's trials ended
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

    def run(
        self, events: Events | None = None, budget: Budget | None = None, patch: alone.Patch | None = None
    ) -> RunReport:
        """Trials until a stop ends them, then the best so far exported. Ctrl-C and SIGTERM stop the current
        trial (recorded FAIL, interrupted) and still export. `budget`: the run's one clock, when the caller
        started it already (the live display shows it); else it starts now. `patch`: what applies a script
        study's export to a copy of its script (apply/export/patched.patched_copy), for its alone rounds; None: none run."""
        report = RunReport()
        self.stop = None
        if self.settings.skip_bad_data:  # trial processes (cold or forked) read it when they build the data
            pipelines.skip_bad_data_in_trials()
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
        budget = budget or Budget.of(self.settings)
        self._say_reserves(budget, patch)
        failure: str | None = None  # the job's failure, when every config would fail the same way
        try:
            with self._warm_server() as server:
                tally = stops.Tally()
                for _ in self._trials(events or Events(), server, budget, tally):
                    report.trials += 1
                assert self.stop is not None  # the loop ends only through a stop
                failure = stops.say_stop(self.stop, tally, self.settings, self.say)
                _say_waiting_retries(self.study, self.say)
                self._finish(report, server, budget, patch)
        except KeyboardInterrupt:
            report.interrupted = True
            self.stop = self.stop or Stop.INTERRUPTED
        except OSError as e:
            if not disk_error(e):
                raise
            report.error = f"cannot write {e.filename or 'the study'}: {e.strerror or e}; the search stopped"
            report.code = ExitCode.ERROR
            self.stop = self.stop or Stop.DISK
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._close(report, failure)

    def _say_reserves(self, budget: Budget, patch: alone.Patch | None) -> None:
        """What the budget keeps back from the trials: for the confirmation, and for a script study's alone
        rounds when they run."""
        note = finish.reserve_note(self.settings, budget)
        if note:
            self.say(note)
        if patch is not None and (note := alone.reserve_note(budget)):
            self.say(note)

    def _finish(self, report: RunReport, server: WarmServer | None, budget: Budget, patch: alone.Patch | None) -> None:
        """After the trials: the winner confirmed and gated, and a script study's export run alone, where the
        settings ask for them and the trials did not stop on the job's own failure."""
        s = self.settings
        assert self.stop is not None
        ends = finish.wanted(s) or patch is not None  # anything to run after the trials
        finishes = ends and not self.stop.job_failed and self._finishes()
        if finish.wanted(s) and finishes:
            report.confirmation = finish.confirm_and_gate(self.study, s, budget, server=server, say=self.say)
        report.alone = self._last_word(budget, patch) if finishes else None

    def _close(self, report: RunReport, failure: str | None) -> RunReport:
        """The report completed: why the trials stopped (stored on the study), the best so far exported even
        on a full disk or an interrupt, and the exit code: the job's failure, else an interrupt's."""
        report.stop = self.stop
        if self.stop is not None:
            with contextlib.suppress(OSError):  # a full disk is said already; the export below tries anyway
                records.write_stop_reason(self.study, self.stop)
        try:
            report.best_yaml = self.export_best()
        except OSError as e:
            if not disk_error(e):
                raise
            report.error = (report.error or "") + f"; best.yaml not written: {e.strerror or e}"
            report.code = ExitCode.ERROR
        if failure and not report.error:
            report.error, report.code = failure, ExitCode.BAD_INPUT
        if report.interrupted and not report.error:
            report.code = ExitCode.INTERRUPTED
        return report

    def _last_word(self, budget: Budget, patch: alone.Patch | None) -> dict[str, Any] | None:
        """A script study's export against the script as written, each run alone (search/loop/alone.py)."""
        return alone.run(self.study, self.settings, budget, patch, say=self.say)

    def _trials(
        self, events: Events, server: WarmServer | None, budget: Budget, tally: stops.Tally
    ) -> Iterator[optuna.trial.FrozenTrial]:
        """ask -> run -> tell, one trial at a time, until a stop: each is checked at the top of the loop,
        before anything is asked (`_stop`, then whether a listed space has anything left to run)."""
        s = self.settings
        budget = budget.trials_begin()  # the warm server is up: its start-up is not the trials' time
        # A resumed study ran its trial 0 before: what it taught (a rebased batch, the knobs a script's model
        # cannot take, longer windows) holds for the trials to come, as it did in the run that made it.
        if (first := baseline_trial(self.study)) is not None and (
            learned := trial0.lessons(s, self.space, TrialRecord.from_frozen(first), self.say)
        ):
            self._respace(*learned)
            s = self.settings
        if isinstance(self.proposals.inner, CoordinateSampler):  # the pass prices its moves against what is left
            self.proposals.inner.budget_left = budget.search_left
            self.proposals.inner.check_reserve = budget.parity_reserve_s
        while True:
            tally.left_s = budget.search_left()
            stop = stops.stop_now(tally, budget, self.settings, self.study)
            if stop is None:
                self._keep_alive()
                admit = Admission(
                    self.study, self.sizer, s.base, Limits(s.trial_timeout, budget.trial_timeout(tally.left_s))
                )
                self.proposals.screen = admit.why_not  # the sampler's draws answer to the same decision
                stop = self._space_spent(tally)
            if stop is not None:
                self.stop = stop
                return
            trial = self.study.ask()
            cfg = config_for(trial, self.space, s.base)
            why = admit.tell_unrun(trial, cfg, events)
            if why is not None:
                tally.told_unrun(trial.number, why)
                continue
            # trial 0 and a class's first trial record the losses its check reads (search/checks/riding.py)
            cfg = self._carried(trial, riding.carry(self.study, s, cfg, TrialRecord.of(trial).role), admit)
            t0 = time.monotonic()
            frozen = run_one(self.study, trial, cfg, s, budget.trial_timeout(tally.left_s), events, server)
            record = TrialRecord.from_frozen(frozen)
            if record.role == Role.BASELINE and (learned := trial0.lessons(s, self.space, record, self.say)):
                self._respace(*learned)
                s = self.settings
            tally.ran(frozen, time.monotonic() - t0)
            events.finished(frozen)
            if record.role == Role.BASELINE and draws.wanted(self.study, frozen):
                draws.draw(self.study, s, frozen, end_folder(s, self.study, "baseline"), budget, server, self.say)
                if finish.wanted(s) and (short := finish.short_note(s, budget, record.wall_s)):
                    self.say(short)
            elif draws.due(self.study, budget) and (first := baseline_trial(self.study)) is not None:
                draws.draw(self.study, s, first, end_folder(s, self.study, "baseline"), budget, server, self.say)
            self.sizer.calibrate(frozen)
            _retry_if_contended(self.study, frozen)
            if cfg.record_steps and record.role != Role.BASELINE:
                _verdict_of_its_own(self.study, s, frozen, self.say)
            classes.check_if_it_matters(
                self.study, s, frozen, end_folder(s, self.study, "parity"), server, self.say, budget
            )
            yield frozen

    def _carried(self, trial: optuna.Trial, cfg: TrialConfig, admit: Admission) -> TrialConfig:
        """`cfg` with the losses its check reads when, with the steps past its window, it still ends within the
        time a trial is given now; else `cfg` as a plain trial, said (killed at its timeout, it would leave
        neither a figure nor a verdict: a class of small batches runs many steps to the time-to-target cap)."""
        est = admit.cost(cfg) if cfg.record_steps else None
        if est is None:
            return cfg
        role = TrialRecord.of(trial).role
        if admit.limits.short(est) is None:
            records.write(trial, TrialRecord(role=role, cost_estimate_s=round(est.seconds, 2)))
            return cfg
        self.say(
            f"check: trial {trial.number} carries no check: its {cfg.record_steps} steps for one (about "
            f"{est.seconds:.0f} s to a result) would run past the {admit.limits.given_s:.0f} s a trial is given now"
        )
        return cfg.replace(record_steps=0)

    def _respace(self, settings: SearchSettings, space: SearchSpace) -> None:
        """The rest of the search on `space` and `settings`' workload: the sampler's proposals, and the study's
        record of both, read by the workers that join from here."""
        self.settings, self.space = settings, space
        self.proposals = Proposals(self.proposals.inner, space, settings.base)
        self.study.sampler = self.proposals
        records.write_rebased(self.study, settings.base.workload(), space.to_dict())

    def _keep_alive(self) -> None:
        """Before each ask: this worker's heartbeat, and a dead worker's trial failed (then retried)."""
        if self.fleet_key is not None:
            fleet.beat(self.study, self.fleet_key)
        if _optuna.heartbeats(self.study):
            optuna.storages.fail_stale_trials(self.study)
        else:
            fail_stale(self.study)  # journal: owner pid/host/heartbeat in user attrs

    def _space_spent(self, tally: stops.Tally) -> Stop | None:
        """Whether a space small enough to list has no config left that would be run now (and no queued
        trial waits): then the search ends without asking for a trial it would write off."""
        left = self.proposals.left()
        if (
            left is None
            or left[None]
            or self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        ):
            return None
        tally.space = left
        return Stop.SPACE_DEFERRED if left[admission.DEFERRED] else Stop.SPACE_EXHAUSTED

    def _finishes(self) -> bool:
        """`search` finishes its own run; a fleet's worker only when it is the last one still running."""
        if self.fleet_key is None:
            return True
        if fleet.finishes(self.study, self.fleet_key):
            return True
        self.say("autotune: other workers are still running: the last one to finish confirms the winner")
        return False

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

    def export_best(self) -> Path | None:
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


def _verdict_of_its_own(
    study: optuna.Study, settings: SearchSettings, frozen: optuna.trial.FrozenTrial, say: Say
) -> None:
    """The verdict of a class's first trial, from the losses it recorded (search/checks/riding.py); said."""
    result = riding.recorded(trial_dir(settings, frozen.number))
    check = riding.judge(study, settings, frozen, result) if result is not None else None
    if check is not None:
        words: dict[str, str] = {Verdict.PASS: "passes", Verdict.FAIL: "FAILS"}
        say(
            f"check: {class_label(frozen)}: {words.get(check['verdict'], check['verdict'])}: {check['reason']}"
            + ("; its configs are not run again" if check["verdict"] == Verdict.FAIL else "")
        )


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
