"""What a script's space says of the knobs its source keeps: the batch it runs when it keeps its own (read
from its DataLoader, not autotune's default), optimizer_fusion for an optimizer without the
fused/foreach pair (fixed with the reason, not searched and recorded "in effect none"), gpus for a script
that sets up its own process group (searched) or none (fixed, with what to add), fp16 only with the
GradScaler handed over, and the precision the script gives at.autocast() as its baseline's."""

from __future__ import annotations

import dataclasses

import ast
import sys
from pathlib import Path

import pytest
import torch

import optuna

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.effects import refuse_unsupported
from autotune.core.errors import PipelineError, TrialUnsupported, exit_code_for
from autotune.core.settings import SearchSettings
from autotune.pipelines import base_config, load_pipeline, own_baseline, script, unsupported_of
from autotune.pipelines.script import fusion
from autotune.pipelines.script.source import scan
from autotune.search.loop.study import warm_start
from autotune.search.space.reading import load_space
from autotune.search.space.machine import Hardware
from autotune.search.space.resolve import for_hardware, resolve
from autotune.search.space.spec import Choices, Fixed, SearchSpace, spec_values
from autotune.search.space.suggest import suggest
from tests.conftest import REPO_ROOT
from tests.pipelines.script_helpers import SCRIPTS
from tests.fakes import UUID_A, UUID_B, FakeGpu, FakeNvml

CPU = Hardware(cuda=False, gpu_count=0, cpu_count=2, cpu_bf16=True, apex=False, memory_bytes=None)
HEAD = """import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=32)
args = p.parse_args()
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
model = torch.nn.Linear(4, 1)
"""


def notes_for(tmp_path: Path, body: str, *args: str) -> tuple[dict[str, object], list[str]]:
    """The default space narrowed for a script `HEAD + body` run with `args`: its knobs and `space:` notes."""
    path = tmp_path / "train.py"
    path.write_text(HEAD + body)
    job = load_pipeline(TrialConfig(pipeline=script.spec_of(str(path), list(args))))
    space = load_space(str(REPO_ROOT / "search_spaces" / "default.yaml"))
    narrowed, notes = for_hardware(space, CPU, stages=0, unsupported=unsupported_of(job))
    return dict(narrowed.knobs), notes


def note(notes: list[str], knob: str) -> str:
    return next(n for n in notes if n.startswith(f"{knob} not searched"))


def own_of(tmp_path: Path, body: str, *args: str) -> tuple[int, int] | None:
    """The (micro-batch, accumulation) a script `HEAD + body` run with `args` runs as its own."""
    path = tmp_path / "train.py"
    path.write_text(HEAD + body)
    return script.load(TrialConfig(pipeline=script.spec_of(str(path), list(args)))).own


def test_a_script_whose_dataloader_builds_its_batches_has_batch_size_searched_from_its_own(tmp_path: Path) -> None:
    """No at.batch_size(): the trial hands its batch over through the DataLoader, so batch_size is searched,
    from the DataLoader's own batch_size as the source reads it (the script's own arguments applied)."""
    loader = "loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)\n"
    knobs, notes = notes_for(tmp_path, loader)
    assert not any(n.startswith("batch_size not searched") for n in notes), notes
    assert own_of(tmp_path, loader) == (32, 1) and own_of(tmp_path, loader, "--batch-size", "4") == (4, 1)
    assert own_of(tmp_path, "loader = DataLoader(data)\n") == (1, 1)  # torch's default
    # A batch the source cannot give: read from what trial 0's loaders deliver, searched from then on.
    unread = note(notes_for(tmp_path, "loader = DataLoader(data, batch_size=args.batch_size // 2)\n")[1], "batch_size")
    assert "its DataLoader's batch_size cannot be read from the source" in unread, unread
    assert "trial 0 runs the script as written and reports the batch its loaders deliver" in unread, unread
    # The option it reads is said too: a trial gives it on the script's command line (trial/loop/script/running.py).
    option = [
        scan(ast.parse(HEAD + body)).own_value("loader_batch_option")
        for body in (loader, "loader = DataLoader(data, 8)\n", "loader = DataLoader(data, args.batch_size // 2)\n")
    ]
    assert option == ["--batch-size", None, None]


def test_optimizer_fusion_is_fixed_for_an_optimizer_without_the_fused_foreach_pair(tmp_path: Path) -> None:
    knobs, notes = notes_for(tmp_path, "opt = torch.optim.Adadelta(model.parameters(), lr=1.0)\n")
    assert knobs["optimizer_fusion"] == Fixed("none")
    said = note(notes, "optimizer_fusion")
    assert "torch.optim.Adadelta takes foreach but not fused" in said, said
    knobs, notes = notes_for(tmp_path, "opt = torch.optim.LBFGS(model.parameters())\n")
    assert "LBFGS takes neither fused nor foreach" in note(notes, "optimizer_fusion")
    # The pair (SGD), or a class autotune cannot read (not torch.optim's): searched, the trial records it.
    for body in ("opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", "opt = Lion(model.parameters())\n"):
        knobs, notes = notes_for(tmp_path, body)
        assert not isinstance(knobs["optimizer_fusion"], Fixed), body
        assert not any(n.startswith("optimizer_fusion not searched") for n in notes)


def test_the_flags_are_read_from_the_constructor_s_signature() -> None:
    assert fusion.flags_of("AdamW") == {"fused", "foreach"}
    assert fusion.flags_of("RMSprop") == {"foreach"}
    assert fusion.flags_of("LBFGS") == frozenset()
    assert fusion.flags_of("Lion") is None and fusion.flags_of("lr_scheduler") is None
    assert fusion.unroutable(()) is None  # the source names no optimizer: searched
    assert fusion.unroutable(("SGD", "Adadelta")) is None  # one of them takes the pair


# --- gpus: a script that sets up its own process group runs under torchrun ------------------------------

DDP = """import torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(model)
"""
NO_GROUP = "loader = DataLoader(data, batch_size=8)\n"
NO_LOADER = "for x, y in data:\n    pass\n"


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with 2 GPUs as the controller sees it (torch.cuda and NVML faked; CUDA never initialised)."""

    def no_cuda_here() -> None:
        raise AssertionError("the controller initialised CUDA")

    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda_here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(UUID_A), FakeGpu(UUID_B)]))


def searched(tmp_path: Path, body: str) -> tuple[dict[str, object], list[str]]:
    """The default space as `autotune search --script` resolves it for `HEAD + body` on this machine."""
    path = tmp_path / "train.py"
    path.write_text(HEAD + body)
    base = TrialConfig(pipeline=script.spec_of(str(path)))
    said: list[str] = []
    space = load_space(str(REPO_ROOT / "search_spaces" / "default.yaml"))
    narrowed, _, _ = resolve(space, load_pipeline(base), SearchSettings(base=base), base, said.append)
    return dict(narrowed.knobs), [s.removeprefix("space: ") for s in said]


def test_gpus_is_searched_for_a_script_that_sets_up_its_own_process_group(tmp_path: Path, two_gpus: None) -> None:
    knobs, notes = searched(tmp_path, DDP)
    assert not isinstance(knobs["gpus"], Fixed) and spec_values(knobs["gpus"]) == [1, 2], knobs["gpus"]
    assert not any(n.startswith(("gpus not searched", "gpus fixed")) for n in notes), notes
    # Its DDP is its own: autotune does not swap it for FSDP.
    assert "wraps its own model" in note(notes, "parallel")
    # A script without a process group: the trial sets it up and shards its DataLoader (trial/loop/script/ranks.py),
    # so gpus is searched too; DDP, not FSDP.
    knobs, notes = searched(tmp_path, NO_GROUP)
    assert spec_values(knobs["gpus"]) == [1, 2], knobs["gpus"]
    assert "FSDP needs the script to shard its own model" in note(notes, "parallel")
    # Without a DataLoader there is nothing to shard: gpus fixed, with what to add.
    knobs, notes = searched(tmp_path, NO_LOADER)
    assert knobs["gpus"] == Fixed(1)
    said = note(notes, "gpus")
    assert "without a torch DataLoader" in said and "every rank would train on the same batches" in said, said


def test_a_global_batch_is_divided_over_the_ranks_of_a_script_that_keeps_its_accumulation(
    tmp_path: Path, two_gpus: None
) -> None:
    """--global-batch 16 on an unedited DataLoader script of batch 8 with no at.accumulation(): it steps
    once per batch, so each GPU count runs the global batch divided over its ranks (16 on one, 8 on each
    of two), never a micro-batch that would need an accumulation the script does not run."""
    path = tmp_path / "train.py"
    path.write_text(HEAD + NO_GROUP)
    base = base_config(script.spec_of(str(path)), None, None, str(tmp_path), global_batch=16, batch_size=16)
    assert base.keeps_accumulation and base.own_accumulation == 1
    said: list[str] = []
    space = load_space(str(REPO_ROOT / "search_spaces" / "default.yaml"))
    narrowed, _, _ = resolve(space, load_pipeline(base), SearchSettings(base=base), base, said.append)
    assert spec_values(narrowed.knobs["gpus"]) == [1, 2] and spec_values(narrowed.knobs["batch_size"]) == [8, 16]
    assert any("the global batch 16 divided over each GPU count's ranks" in s for s in said), said
    for gpus, batch in ((1, 16), (2, 8)):
        batch_and_gpus = SearchSpace(knobs={k: narrowed.knobs[k] for k in ("gpus", "batch_size")})
        cfg = suggest(optuna.trial.FixedTrial({"gpus": gpus}), batch_and_gpus, base)  # batch_size: no param
        assert (cfg.gpus, cfg.batch_size, cfg.grad_accum, cfg.global_batch_size) == (gpus, batch, 1, 16)
    # The baseline is the one micro-batch that keeps it on one GPU, not the script's own 8 (2 steps of 8).
    assert baseline_of(base.replace(baseline=own_baseline(load_pipeline(base), 16) or None)).batch_size == 16
    # The script's own 8 is its baseline where the study's global batch is it.
    at8 = base.replace(global_batch=8, batch_size=8)
    assert own_baseline(load_pipeline(at8), 8) == {"batch_size": 8}
    # A script that hands its accumulation over (at.accumulation()) takes any micro-batch that divides it.
    handed = base_config(
        script.spec_of(str(SCRIPTS / "tokens.py")), None, None, str(tmp_path), global_batch=16, batch_size=16
    )
    assert not handed.keeps_accumulation and handed.admits(2, 1) and handed.admits(4, 2)
    assert not base.admits(4, 2) and not base.admits(8, 1) and base.admits(8, 2)


@pytest.mark.parametrize(
    "source, sets_up",
    [
        ("import torch.distributed as dist\ndist.init_process_group(backend='nccl')\n", True),
        ("import torch\ntorch.distributed.init_process_group('nccl')\n", True),
        ("from torch.distributed import init_process_group\ninit_process_group()\n", True),
        ("from torch.distributed import init_process_group as setup\nsetup('gloo')\n", True),
        ("from torch.distributed.device_mesh import init_device_mesh\nmesh = init_device_mesh('cuda', (2,))\n", True),
        ("import torch.distributed as dist\nrank = dist.get_rank() if dist.is_initialized() else 0\n", False),
        (
            "import torch.distributed as dist\n# dist.init_process_group() under torchrun\nprint('init_process_group')\n",
            False,
        ),
    ],
)
def test_the_process_group_is_read_from_the_source_in_any_spelling(source: str, sets_up: bool) -> None:
    assert scan(ast.parse(source)).process_group is sets_up


def test_a_trial_asking_gpus_of_a_script_without_a_process_group_or_a_dataloader_exits_5(tmp_path: Path) -> None:
    from autotune.trial.loop import worker

    path = tmp_path / "train.py"
    path.write_text(HEAD + NO_LOADER)
    # Once a run has shown it (trial 0's record): no group, no DataLoader. Before one, its run decides (ranks.py).
    shown = (("loaders", 0), ("optimizers", ("SGD",)), ("own_group", False))
    with pytest.raises(TrialUnsupported, match=r"gpus \(the script sets up no process group and builds") as e:
        worker.run(TrialConfig(pipeline=script.spec_of(str(path)), gpus=2, warmup_steps=1, timed_steps=1, shown=shown))
    assert exit_code_for(e.value.reason) == 5
    path.write_text(HEAD + DDP)
    assert "gpus" not in unsupported_of(load_pipeline(TrialConfig(pipeline=script.spec_of(str(path)), gpus=2)))


# --- fp16 needs the GradScaler handed over ---------------------------------------------------------------

GPU = Hardware(cuda=True, gpu_count=1, cpu_count=2, cpu_bf16=True, apex=False, memory_bytes=None)
AMP = """from autotune import script as at
with at.autocast({own}):
    loss = model(torch.randn(2, 4)).sum()
"""
SCALER = "scaler = at.scaler()\n"


def on_gpu(tmp_path: Path, body: str) -> tuple[dict[str, object], list[str], object]:
    path = tmp_path / "train.py"
    path.write_text(HEAD + body)
    job = load_pipeline(TrialConfig(pipeline=script.spec_of(str(path))))
    space = load_space(str(REPO_ROOT / "search_spaces" / "default.yaml"))
    narrowed, notes = for_hardware(space, GPU, stages=0, unsupported=unsupported_of(job))
    return dict(narrowed.knobs), notes, job


def test_fp16_is_not_searched_for_a_script_that_hands_over_no_scaler(tmp_path: Path) -> None:
    knobs, notes, job = on_gpu(tmp_path, AMP.format(own=""))
    assert knobs["precision"] == Choices(("fp32", "bf16"))
    said = next(n for n in notes if n.startswith("precision"))
    assert "dropped fp16" in said and "fp16 needs loss scaling: hand your GradScaler over with at.scaler()" in said
    # A hand-written trial asking for it is refused (exit 5); bf16 runs.
    cfg = TrialConfig(pipeline=job.spec)
    with pytest.raises(TrialUnsupported, match="precision fp16 \\(fp16 needs loss scaling") as e:
        refuse_unsupported(cfg.replace(precision="fp16"), unsupported_of(job))
    assert exit_code_for(e.value.reason) == 5
    refuse_unsupported(cfg.replace(precision="bf16"), unsupported_of(job))
    with pytest.raises(PipelineError, match="--baseline sets precision fp16"):
        load_pipeline(cfg.replace(baseline={"precision": "fp16"}))
    # Handed over: fp16 is searched. The script's own fp16 (its own scaler): searched too, it is its baseline.
    for body in (AMP.format(own="") + SCALER, AMP.format(own='"fp16"')):
        knobs, notes, _ = on_gpu(tmp_path, body)
        assert knobs["precision"] == Choices(("fp32", "bf16", "fp16")), body


def test_apex_is_not_searched_for_a_script_even_where_apex_is_installed(tmp_path: Path) -> None:
    """A script builds its own optimizer: the trial sets its fused/foreach pair, and has no way to run apex's
    FusedAdam in its place (a trial asking for it would record the for-loop under apex's name)."""
    path = tmp_path / "train.py"
    path.write_text(HEAD + AMP.format(own="") + SCALER)
    job = load_pipeline(TrialConfig(pipeline=script.spec_of(str(path))))
    space = load_space(str(REPO_ROOT / "search_spaces" / "default.yaml"))
    apex = dataclasses.replace(GPU, apex=True)
    narrowed, notes = for_hardware(space, apex, stages=0, unsupported=unsupported_of(job))
    assert narrowed.knobs["optimizer_fusion"] == Choices(("none", "foreach", "fused")), notes
    said = next(n for n in notes if n.startswith("optimizer_fusion"))
    assert "dropped apex" in said and "the script builds its own optimizer" in said, said


def test_the_warm_start_takes_no_fp16_a_script_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without NVML (or on a V100) the guide's AMP is fp16: for a script that hands over no scaler the warm
    start keeps the baseline's precision instead of a trial that would only be refused."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_fails=True))
    knobs, _, job = on_gpu(tmp_path, AMP.format(own=""))
    base = TrialConfig(pipeline=job.spec)
    assert warm_start(base, GPU, SearchSpace(knobs=knobs)).precision == "fp32"  # type: ignore[arg-type]
    knobs, _, job = on_gpu(tmp_path, AMP.format(own="") + SCALER)
    assert warm_start(base, GPU, SearchSpace(knobs=knobs)).precision == "fp16"  # type: ignore[arg-type]


# --- the script's own precision: trial 0 runs what the user ran --------------------------------------------

OPTION = 'p.add_argument("--precision", default="bf16")\nargs = p.parse_args()\n'


@pytest.mark.parametrize(
    "own, args, want",
    [
        ("", (), "fp32"),
        ('"bf16"', (), "bf16"),
        ("torch.bfloat16", (), "bf16"),
        ("own=torch.float16", (), "fp16"),
        ("None", (), "fp32"),
        ("args.precision", (), "bf16"),
        ("args.precision", ("--precision", "fp32"), "fp32"),
    ],
)
def test_the_script_s_own_precision_is_read_from_at_autocast(
    tmp_path: Path, own: str, args: tuple[str, ...], want: str
) -> None:
    path = tmp_path / "train.py"
    path.write_text(HEAD + OPTION + AMP.format(own=own) + SCALER)
    job = load_pipeline(TrialConfig(pipeline=script.spec_of(str(path), list(args))))
    assert script.own_values(job.uses)["precision"] == want
    assert own_baseline(job).get("precision", "fp32") == want  # trial 0's config says what the user ran
    assert "precision" not in unsupported_of(job)


def test_an_own_precision_the_source_cannot_give_keeps_precision_fixed_with_why(tmp_path: Path) -> None:
    knobs, notes, job = on_gpu(tmp_path, AMP.format(own="pick(args)") + SCALER)
    assert knobs["precision"] == Fixed("fp32") and "precision" not in own_baseline(job)
    said = note(notes, "precision")
    assert "the precision at.autocast() is given cannot be read: 'pick(args)' is not a precision" in said, said


STREAM = """import torch
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):  # yields its whole stream in every worker: the trials keep its loader's own
    def __iter__(self):
        while True:
            yield torch.randn(4), torch.randn(1)


loader = DataLoader(Stream(), batch_size=8)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    if step == 10_000:
        break
"""


@pytest.mark.slow
def test_the_loader_knobs_of_a_script_that_streams_an_iterable_dataset_are_fixed_after_trial_0(tmp_path: Path) -> None:
    """Its DataLoader is in the source, so the loader knobs are searched until trial 0 shows every loader it
    built loads an IterableDataset (kept as written by every trial): from there they are fixed, said, and
    the study's space (what workers read) says so."""
    import optuna

    from autotune.search.store.records import StudyRecord
    from autotune.search.store.storage import open_storage
    from tests.pipelines.framework_helpers import autotune, ok

    script_path = tmp_path / "train.py"
    script_path.write_text(STREAM)
    search = autotune(
        "search", "--script", str(script_path), "--budget", "60s", "--n-trials", "3", "--trial-seconds", "1",
        "--warmup-steps", "1", "--confirm-rounds", "0", "--parity-steps", "0", "--seed", "0", cwd=tmp_path,
    )  # fmt: skip
    ok(search)
    assert "space: num_workers, prefetch_factor, persistent_workers not searched from here" in search.stdout
    study = optuna.load_study(study_name="autotune", storage=open_storage(str(tmp_path / "studies.db")))
    knobs = (StudyRecord.of(study).space or {})["knobs"]
    assert knobs["num_workers"] == {"fixed": 0} and knobs["persistent_workers"] == {"fixed": False}
