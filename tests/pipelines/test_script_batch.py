"""A script's batch handed over (at.batch_size, at.accumulation): its own value is the baseline, read from
its source; the trial hands the config's micro-batch and, at a study's global batch, its accumulation; the
lr follows by the rule of the script's own optimizer (linear for SGD, sqrt for the Adam family), and
parity and time to target run the script's own loop with it."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

import pytest

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.training import changes_step, training_math
from autotune.pipelines import load_pipeline, own_baseline, script, unsupported_of, base_config
from autotune.pipelines.script import source as script_source
from autotune.search.checks import parity, target
from autotune.trial.loop import worker
from tests.pipelines.script_helpers import SCRIPTS

TOKENS = SCRIPTS / "tokens.py"
ADAMW = "torch.optim.AdamW(model.parameters(), lr=args.lr)"
SGD = "torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)"
LOADER = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")


def study_base(path: Path, args: list[str], **extra: Any) -> TrialConfig:
    """The study's workload as `autotune search --script` makes it: the script's lr and rule read from its
    source, the baseline its own batch (what the session does with own_baseline)."""
    base = base_config(script.spec_of(str(path), args), None, None, "studies", **extra)
    own = own_baseline(load_pipeline(base), base.global_batch)
    return base.replace(baseline=tuple(own.items()), num_threads=1) if own else base.replace(num_threads=1)


def sgd_script(tmp_path: Path) -> Path:
    """tokens.py as written, with SGD and momentum in place of AdamW."""
    source = TOKENS.read_text()
    assert ADAMW in source
    out = tmp_path / "tokens_sgd.py"
    out.write_text(source.replace(ADAMW, SGD))
    return out


def scan(source: str, *args: str) -> script_source.Uses:
    return script_source.scan(ast.parse(source), args)


# --- the source scan: the script's own batch, its lr and its optimizer's rule ---------------------


def test_the_script_s_own_batch_is_read_from_its_source_with_its_arguments_applied() -> None:
    head = "import argparse\nfrom autotune import script as at\np = argparse.ArgumentParser()\n"
    head += "p.add_argument('--batch-size', type=int, default=16)\nargs = p.parse_args()\n"
    assert scan(head + "b = at.batch_size(args.batch_size)").own_value("batch_size") == 16
    assert scan(head + "b = at.batch_size(args.batch_size)", "--batch-size", "32").own_value("batch_size") == 32
    assert scan(head + "b = at.batch_size(args.batch_size)", "--batch-size=4").own_value("batch_size") == 4
    assert scan(head + "B = 12\nb = at.batch_size(B)").own_value("batch_size") == 12
    assert scan(head + "b = at.batch_size(default=6)").own_value("batch_size") == 6
    unread = scan(head + "b = at.batch_size(args.batch_size // 2)")
    assert "is not a number" in unread.own_value("batch_size")
    job_why = script.unsupported(unread)["batch_size"]
    assert job_why.startswith("at.batch_size()'s default cannot be read")
    uses = scan(head + "import torch\nopt = torch.optim.SGD([], lr=0.1, momentum=0.9)\nb = at.batch_size(8)")
    assert uses.own_value("lr") == 0.1 and uses.optimizers == ("SGD",)


def test_a_script_without_a_dataloader_has_its_batch_searched_only_when_it_hands_it_over() -> None:
    tokens = script.load(TrialConfig(pipeline=script.spec_of(str(TOKENS))))
    assert "batch_size" not in unsupported_of(tokens) and tokens.own == (4, 2)
    plain = script.load(TrialConfig(pipeline=script.spec_of(str(SCRIPTS / "no_loader.py"))))
    assert plain.unsupported.why["batch_size"].startswith("the script builds its batches without a torch DataLoader")
    # At a study's global batch a script that takes no accumulation keeps its own: the batch is still
    # handed over (the global batch divided over the ranks, TrialConfig.keeps_accumulation).
    source = "from autotune import script as at\nb = at.batch_size(8)\n"
    assert "batch_size" not in script.unsupported(scan(source))
    assert "batch_size" not in script.unsupported(scan(source), global_batch=32)


def test_an_lr_that_reads_the_loader_s_batch_option_is_the_script_s_own_rule() -> None:
    """lr = base * args.batch_size / 256: the trial gives --batch-size on the command line, so the script's own
    arithmetic scales its lr already; its rule is the study's, and the trial divides it out (batch.py). A form
    that is neither a product with the batch nor with its root keeps the batch fixed, with why."""
    head = "import argparse, math, torch\nfrom torch.utils.data import DataLoader\np = argparse.ArgumentParser()\n"
    head += "p.add_argument('--batch-size', type=int, default=16)\np.add_argument('--lr', type=float, default=0.1)\n"
    head += "args = p.parse_args()\nloader = DataLoader([], batch_size=args.batch_size)\n"

    def rule(lr: str, before: str = "") -> Any:
        return scan(head + before + f"opt = torch.optim.AdamW([], lr={lr})\n").own_value("lr_batch_rule")

    assert rule("args.lr * args.batch_size / 256") == "linear"
    assert rule("lr", "base = args.lr / 256\nlr = base * args.batch_size\n") == "linear"  # through names
    assert rule("args.lr * math.sqrt(args.batch_size / 256)") == "sqrt"
    assert rule("args.lr * (args.batch_size / 256) ** 0.5") == "sqrt"
    assert rule("args.lr") is None and rule("0.1") is None
    assert rule("args.lr / args.batch_size") == script_source.OTHER_FORM  # inversely
    assert rule("min(0.1, args.lr * args.batch_size)") == script_source.OTHER_FORM
    linear = scan(head + "opt = torch.optim.AdamW([], lr=args.lr * args.batch_size / 256)\n")
    assert script.lr_rule(linear) == (
        "linear",
        "the script's lr reads its --batch-size: it scales its lr with its batch itself, by the linear rule",
    )
    assert "batch_size" not in script.unsupported(linear)
    other = scan(head + "opt = torch.optim.AdamW([], lr=min(0.1, args.lr * args.batch_size))\n")
    why = script.unsupported(other)["batch_size"]
    assert why.startswith("its lr reads --batch-size, which its DataLoader's batch_size is, in a form"), why
    assert script.lr_rule(other)[0] == "sqrt"  # AdamW's: the batch is not searched anyway


def test_the_lr_rule_follows_the_optimizer_the_script_constructs(tmp_path: Path) -> None:
    def rule(source: str) -> tuple[str, str]:
        return script.lr_rule(scan("import torch\n" + source))

    assert rule("o = torch.optim.SGD(p, lr=0.1, momentum=0.9)")[0] == "linear"
    assert rule("from torch.optim import AdamW\no = AdamW(p)")[0] == "sqrt"
    mixed, why = rule("o = torch.optim.SGD(p) if a else torch.optim.Adam(p)")
    assert mixed == "sqrt" and "whose rules differ" in why and "--lr-scaling" in why
    assert "no optimizer autotune knows" in rule("o = make_optimizer(p)")[1]
    # The study's workload: the script's rule and lr, unless the user gives them.
    assert study_base(sgd_script(tmp_path), ["--lr", "0.2"]).lr_scaling == "linear"
    assert study_base(sgd_script(tmp_path), ["--lr", "0.2"]).lr == 0.2
    assert study_base(TOKENS, []).lr_scaling == "sqrt"
    assert study_base(TOKENS, [], lr_scaling="none").lr_scaling == "none"
    # --global-batch 32 is 4x the script's own 4 x 2: TrialConfig.lr is given for it, sqrt-scaled.
    assert study_base(TOKENS, [], global_batch=32, batch_size=32).lr == pytest.approx(0.01 * 2)


def test_the_new_calls_are_the_identity_outside_a_trial() -> None:
    from autotune import script as at

    assert at.batch_size(12) == 12 and at.accumulation(3) == 3 and at.accumulation() == 1
    assert at.lr(0.25) == 0.25 and at.data_seed(5) == 5
    from autotune.pipelines.script import api

    api.install(api.Trial(batch_size=8, own_batch_size=4))
    try:  # in a trial: the trial's micro-batch, and a default that is no batch is the script's error
        assert at.batch_size(4) == 8 and at.accumulation(2) == 2
        with pytest.raises(ValueError, match="whole number"):
            at.batch_size(0)
    finally:
        api.install(None)


# --- the trial: the batch handed over, the lr scaled by the rule ------------------------------------


def trial(base: TrialConfig, **knobs: Any) -> Any:
    return worker.run(base.replace(warmup_steps=1, timed_steps=3, window=1, **knobs))


def test_the_trial_hands_over_the_batch_and_scales_the_optimizer_s_lr(tmp_path: Path) -> None:
    base = study_base(TOKENS, ["--steps", "50"])
    assert dict(base.baseline or ()) == {"batch_size": 4}
    # at.accumulation(args.accum)'s default (2) is the script's own: the global batch counts it.
    assert base.own_accumulation == 2 and baseline_of(base).global_batch_size == 8
    assert training_math(base.replace(batch_size=16), False)[0] == "global batch 8 -> 32"
    r = trial(baseline_of(base))  # the baseline: the script as written
    a = r.applied
    assert a["batch_size"]["in_effect"] == 4 and a["script"]["accumulation"] == 2
    assert a["script"]["samples_per_step"] == 8  # 4 x 2, as handed over: no loader counts them
    assert a["lr"]["in_effect"] == 0.01 and a["lr"]["rule"]["rule"] == "sqrt"
    r = trial(base.replace(batch_size=16))  # global batch 16 x 2 against its own 4 x 2: sqrt(4)
    a = r.applied
    assert a["script"]["samples_per_step"] == 32 and a["lr"]["in_effect"] == pytest.approx(0.02)
    assert a["lr"]["rule"] == {"rule": "sqrt", "optimizer": "AdamW", "why": script.load(base).lr_rule_why}
    # A study's global batch: the micro-batch and the accumulation are the trial's, the lr for that batch.
    fixed = study_base(TOKENS, ["--steps", "50"], global_batch=16, batch_size=16)
    a = trial(fixed.replace(batch_size=2)).applied
    assert a["batch_size"]["in_effect"] == 2 and a["script"]["accumulation"] == 8
    assert a["script"]["samples_per_step"] == 16 and a["lr"]["in_effect"] == pytest.approx(0.01 * math.sqrt(2))
    # SGD's rule is linear: twice the batch, twice the lr.
    sgd = study_base(sgd_script(tmp_path), ["--steps", "50", "--lr", "0.2"])
    a = trial(sgd.replace(batch_size=8)).applied
    assert a["lr"]["in_effect"] == pytest.approx(0.4) and a["lr"]["rule"]["rule"] == "linear"
    assert a["lr"]["rule"]["optimizer"] == "SGD"


def test_a_script_that_scales_its_own_lr_through_at_lr_is_not_scaled_twice(tmp_path: Path) -> None:
    """OneCycleLR sets the lr from its max_lr: the constructor's lr would be overwritten, so the script
    hands max_lr through at.lr() and the trial leaves the constructor's alone."""
    source = TOKENS.read_text().replace(
        "warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))",
        "warmup = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=at.lr(args.lr), total_steps=args.steps)",
    )
    path = tmp_path / "one_cycle.py"
    path.write_text(source)
    a = trial(study_base(path, ["--steps", "50"]).replace(batch_size=16)).applied
    assert a["lr"]["requested"] == 0.01 and a["lr"]["in_effect"] == pytest.approx(0.02)
    assert a["script"]["optimizers_built"][0]["factor"] == 1.0  # the constructor's lr as written


# --- the checks run the script's own loop, with its own optimizer's rule ----------------------------


def test_a_script_with_no_dataloader_is_searched_and_its_parity_runs_its_own_loop(tmp_path: Path, server: Any) -> None:
    from autotune.search.space.machine import Hardware
    from autotune.search.space.reading import load_space
    from autotune.search.space.resolve import by_global_batch, for_hardware
    from autotune.search.space.spec import Fixed
    from tests.conftest import REPO_ROOT

    base = study_base(TOKENS, ["--steps", "100000"], global_batch=16, batch_size=16)
    job = load_pipeline(base)
    space = load_space(str(REPO_ROOT / "search_spaces" / "default.yaml"))
    hw = Hardware(cuda=False, gpu_count=0, cpu_count=2, cpu_bf16=True, apex=False, memory_bytes=None)
    narrowed, notes = for_hardware(space, hw, stages=0, unsupported=unsupported_of(job))
    narrowed, _ = by_global_batch(narrowed, base)
    for knob in LOADER:
        assert any(n.startswith(knob) and "the script builds no torch DataLoader" in n for n in notes), notes
    searched = {k for k, v in narrowed.knobs.items() if not isinstance(v, Fixed)}
    assert {"precision", "batch_size"} <= searched and not searched & set(LOADER)
    # Parity of a precision change and of micro-batch x accumulation, on the script's own loop.
    baseline = baseline_of(base)
    ref = parity.noise_reference(baseline, 8, tmp_path / "reference", 120, server)
    assert ref.noise > 0  # at.data_seed(): the data-order twin draws other batches from the memmap
    for candidate in (base.replace(precision="bf16"), base.replace(batch_size=2)):
        assert not changes_step(candidate)
        v = parity.check(candidate, baseline, 8, tmp_path / candidate.precision, 120, server, ref)
        assert v.deviation is not None and v.failure is None and v.reason.startswith("loss trajectory")
        applied = json.loads((tmp_path / candidate.precision / "candidate" / "result.json").read_text())["applied"]
        assert applied["batch_size"]["in_effect"] == candidate.batch_size
        assert applied["script"]["accumulation"] == 16 // candidate.batch_size


def time_to_target(path: Path, args: list[str], folder: Path, server: Any) -> tuple[Any, dict[str, Any], str]:
    base = study_base(path, [*args, "--steps", "100000"])
    baseline, candidate = baseline_of(base), base.replace(batch_size=8)
    ref = parity.noise_reference(baseline, 8, folder / "reference", 120, server)
    verdict = target.check(candidate, ref, folder, 120, 2.0, 1.0, server)
    applied = json.loads((folder / "candidate" / "result.json").read_text())["applied"]
    reference = json.loads((folder / "reference" / "baseline" / "result.json").read_text())["applied"]
    assert reference["lr"]["rule"]["optimizer"] == applied["lr"]["rule"]["optimizer"]
    label = "; ".join(training_math(candidate, batch_norm=False))
    assert verdict.target == pytest.approx(sum(ref.losses[-target.SMOOTH :]) / target.SMOOTH)
    return verdict, applied, label


def test_the_global_batch_class_is_judged_on_the_script_s_own_optimizer(tmp_path: Path, server: Any) -> None:
    """The same script with SGD and with AdamW: each one's time to target is its own optimizer's
    trajectory, at the lr its own rule gives the doubled batch."""
    sgd, sgd_applied, sgd_label = time_to_target(sgd_script(tmp_path), ["--lr", "0.2"], tmp_path / "sgd", server)
    adam, adam_applied, adam_label = time_to_target(TOKENS, [], tmp_path / "adam", server)
    assert sgd_applied["lr"]["rule"] == {**sgd_applied["lr"]["rule"], "rule": "linear", "optimizer": "SGD"}
    assert sgd_applied["lr"]["in_effect"] == pytest.approx(0.4) and "(linear rule)" in sgd_label
    assert adam_applied["lr"]["rule"]["rule"] == "sqrt" and adam_applied["lr"]["rule"]["optimizer"] == "AdamW"
    assert adam_applied["lr"]["in_effect"] == pytest.approx(0.01 * math.sqrt(2)) and "(sqrt rule)" in adam_label
    for v in (sgd, adam):  # a verdict either way, on the script's trajectories
        assert v.failure is None and isinstance(v.passed, bool)
    assert sgd.target != adam.target


@pytest.mark.slow
def test_a_search_on_the_script_with_no_dataloader_searches_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`autotune search --script` on the token script at a global batch: its own batch is the baseline,
    the loader knobs are fixed with why, the micro-batch and precision are searched, and best.yaml
    re-measures under `autotune trial`."""
    from tests.pipelines.framework_helpers import autotune

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    search = autotune(
        "search", "--script", str(TOKENS), "--script-args", "--steps 100000", "--global-batch", "16",
        "--budget", "40s", "--n-trials", "3", "--trial-seconds", "1", "--warmup-steps", "1",
        "--confirm-rounds", "0", "--parity-steps", "8", "--seed", "0", cwd=tmp_path,
    )  # fmt: skip
    assert search.returncode == 0, search.stderr[-3000:]
    out = search.stdout
    assert "baseline: your job as written: batch_size 4" in out
    assert (
        "space: num_workers not searched: not supported by this pipeline: the script builds no torch DataLoader" in out
    )
    searched = next(line for line in out.splitlines() if "knobs searched:" in line)
    assert "batch_size" in searched and "precision" in searched
    best = tmp_path / "studies" / "autotune" / "best.yaml"
    again = autotune("trial", "--config", str(best), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads((best.parent / "trial" / "result.json").read_text())
    micro = result["applied"]["batch_size"]["in_effect"]
    assert result["applied"]["script"]["accumulation"] * micro == 16
    assert result["applied"]["lr"]["rule"]["rule"] == "sqrt"


def test_an_optimizer_whose_rule_the_study_does_not_use_is_said(tmp_path: Path) -> None:
    """A script that builds SGD or AdamW by its arguments: the scan cannot tell which, the study keeps
    the default rule, and the trial says the optimizer that stepped wants another."""
    path = tmp_path / "either.py"
    path.write_text(TOKENS.read_text().replace(ADAMW, f"{SGD} if args.lr > 0.1 else {ADAMW}"))
    base = study_base(path, ["--steps", "50", "--lr", "0.2"])
    assert base.lr_scaling == "sqrt"
    why = trial(base.replace(batch_size=8)).applied["lr"]["rule"]["why"]
    assert "whose rules differ" in why and "the optimizer that stepped is SGD, whose rule is linear" in why
    given = trial(base.replace(batch_size=8, lr_scaling="linear")).applied["lr"]
    assert given["rule"]["why"].startswith("--lr-scaling linear, given") and given["in_effect"] == pytest.approx(0.4)


# --- a batch set by a configurator: read when trial 0 runs --------------------------------------------------

CONFIGURED = Path(__file__).parents[1] / "trial" / "loop" / "script" / "scripts" / "configured" / "train.py"


def test_a_configurator_set_batch_is_read_at_run_time_and_its_message_says_what_to_write() -> None:
    """`batch_size = at.batch_size(batch_size)` after nanoGPT's exec(configurator): the source cannot say the
    default (the name is assigned twice, and the configurator may override it), so until trial 0 reports it
    batch_size is fixed, with what to write; once the study records it, the job hands the batch over."""
    spec = script.spec_of(str(CONFIGURED), ["--batch_size=6"])
    job = load_pipeline(TrialConfig(pipeline=spec))
    why = job.unsupported.why["batch_size"]
    assert "trial 0 runs the script as written and reports the value the script hands it" in why, why
    assert "`batch_size = at.batch_size(12)`" in why and "--baseline" in why
    told = load_pipeline(TrialConfig(pipeline=spec, baseline={"batch_size": 6}))
    assert "batch_size" not in told.unsupported and told.own == (6, 1)


@pytest.mark.slow
def test_a_configurator_set_batch_is_searched_once_trial_0_has_reported_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search: trial 0 runs the script as written, records the batch the configurator set (6, not the 12
    its source assigns first, nor autotune's 8), the study is rebased on it, and batch_size is searched from
    then: later trials hand over other batches through at.batch_size()."""
    import optuna

    from autotune.search.store.records import StudyRecord, TrialRecord
    from autotune.search.store.storage import open_storage
    from tests.pipelines.framework_helpers import autotune

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    search = autotune(
        "search", "--script", str(CONFIGURED), "--script-args=--batch_size=6", "--budget", "60s",
        "--n-trials", "4", "--trial-seconds", "1", "--warmup-steps", "1", "--confirm-rounds", "0",
        "--parity-steps", "0", "--seed", "0", "--sampler", "random", cwd=tmp_path,
    )  # fmt: skip
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    assert (
        "baseline: trial 0 ran the script's own batch_size 6, which its source could not say: batch_size searched"
        in (search.stdout)
    ), search.stdout[-3000:]
    study = optuna.load_study(study_name="autotune", storage=open_storage(str(tmp_path / "studies.db")))
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    assert TrialRecord.from_frozen(trials[0]).config["batch_size"] == 6
    assert TrialRecord.from_frozen(trials[0]).applied["batch_size"]["in_effect"] == 6
    assert dict((StudyRecord.of(study).workload or {})["baseline"])["batch_size"] == 6
    assert "batch_size" in (StudyRecord.of(study).space or {})["knobs"]
    handed = {TrialRecord.from_frozen(t).applied.get("batch_size", {}).get("in_effect") for t in trials[1:]}
    assert handed - {None, 6}, handed  # another batch was handed over and ran


@pytest.mark.slow
def test_a_script_that_accumulates_on_its_own_is_searched_with_the_batch_that_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama2.c's shape (batch 6 handed over after a configurator, 2 micro-batches accumulated by the script's
    own loop, lr 0.005 from the configurator): trial 0's report rebases the study on all three, so a trial
    at another batch is labelled with the global batch and lr that ran, and best.yaml's training math says
    the accumulation."""
    import optuna
    import yaml

    from autotune.search.store.records import StudyRecord, TrialRecord
    from autotune.search.store.storage import open_storage
    from tests.pipelines.framework_helpers import autotune

    accumulating = CONFIGURED.with_name("accumulating.py")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = "--batch_size=6 --gradient_accumulation_steps=2 --learning_rate=0.005"
    search = autotune(
        "search", "--script", str(accumulating), f"--script-args={args}", "--budget", "60s",
        "--n-trials", "4", "--trial-seconds", "1", "--warmup-steps", "1", "--confirm-rounds", "0",
        "--parity-steps", "0", "--seed", "0", "--sampler", "random", "--space", str(_batch_only(tmp_path)),
        cwd=tmp_path,
    )  # fmt: skip
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    said = "baseline: trial 0 ran the script's own batch_size 6, accumulation 2 (global batch 12), lr 0.005"
    assert said in search.stdout, search.stdout[-3000:]
    study = optuna.load_study(study_name="autotune", storage=open_storage(str(tmp_path / "studies.db")))
    workload = StudyRecord.of(study).workload or {}
    assert (workload["own_accumulation"], workload["lr"]) == (2, 0.005)
    labels = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        r = TrialRecord.from_frozen(t)
        labels[r.config["batch_size"]] = r.training_math
        assert r.applied["global_batch"]["in_effect"] == 2 * r.config["batch_size"]
    assert labels[6] == ()
    others = {b: m for b, m in labels.items() if b != 6}
    assert others, labels  # another batch ran
    for b, math_ in others.items():
        assert math_[0] == f"global batch 12 -> {2 * b}" and math_[1].startswith("lr 0.005 -> "), math_
    best = yaml.safe_load((tmp_path / "studies" / "autotune" / "best.yaml").read_text())
    tm = best["training_math"]
    assert tm["grad_accum"] == 2 and tm["baseline_global_batch"] == 12
    assert tm["global_batch"] == 2 * best["config"]["batch_size"]


def _batch_only(tmp_path: Path) -> Path:
    """A space that searches the batch alone (the speed-only knobs fixed): every trial after trial 0 runs
    another global batch."""
    out = tmp_path / "space.yaml"
    out.write_text("knobs:\n  batch_size: [3, 12]\n  num_workers: 0\n  optimizer_fusion: none\n  num_threads: 1\n")
    return out
