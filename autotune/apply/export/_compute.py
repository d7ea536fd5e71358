"""How a trial's model computed (precision, memory format, torch.compile, activation checkpointing, cudnn's
autotuner, the thread count), in every export's terms: a framework's fields and hooks, the script's lines,
the diff's edits."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from autotune.apply.export import _strategy
from autotune.apply.export._common import IN_SCRIPT
from autotune.apply.export._source import Edit
from autotune.core.config import LEADS, TrialConfig
from autotune.pipelines.script import source

if TYPE_CHECKING:
    from autotune.apply.export.diff import Rewrite

_LIGHTNING_PRECISION = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}
_ACC_PRECISION = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}
_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
_NO_THREADS = "0 = torch's default; nothing to set"


def rows(cfg: TrialConfig, target: str) -> dict[str, str]:
    """The knob table's rows for the compute knobs, in `target`'s terms."""
    if target == "lightning":
        return {
            "precision": f"trainer_kwargs['precision'] = {_LIGHTNING_PRECISION[cfg.precision]!r}",
            "checkpoint_segments": "no Trainer flag: wrap the first k blocks yourself (see below)",
            "channels_last": "no Trainer flag: AutotuneHooks converts model and batches"
            if cfg.channels_last
            else "no Trainer flag; off, nothing to do",
            "cudnn_benchmark": "trainer_kwargs['benchmark'] (sets torch.backends.cudnn.benchmark)",
            "compile": "no Trainer flag: torch.compile(model) before trainer.fit (see below)",
            "num_threads": "torch.set_num_threads (see below)" if cfg.num_threads else _NO_THREADS,
        }
    if target == "hf":
        return {
            "precision": "bf16 / fp16",
            "checkpoint_segments": "gradient_checkpointing (every layer, see below)",
            "channels_last": "not a TrainingArguments field (see below)",
            "cudnn_benchmark": "not a TrainingArguments field: torch.backends.cudnn.benchmark (below)",
            "compile": "torch_compile / torch_compile_mode",
            "num_threads": "not a TrainingArguments field: torch.set_num_threads (below)"
            if cfg.num_threads
            else _NO_THREADS,
        }
    return {
        "precision": f"mixed_precision: {_ACC_PRECISION[cfg.precision]}",
        "checkpoint_segments": f"{IN_SCRIPT}, torch.utils.checkpoint on the first k blocks"
        if cfg.checkpoint_segments
        else "off, nothing to do",
        "channels_last": (
            f"{IN_SCRIPT}, 4-D inputs only (FSDP shards contiguous weights only)"
            if _strategy.fsdp_on(cfg)
            else f"{IN_SCRIPT}, model.to(memory_format=torch.channels_last) + 4-D inputs"
        )
        if cfg.channels_last
        else "off, nothing to do",
        "cudnn_benchmark": f"{IN_SCRIPT}, torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark}",
        "compile": "dynamo_config (backend INDUCTOR, dynamo_mode)" if cfg.compile != "off" else "off: no dynamo_config",
        "num_threads": f"{IN_SCRIPT}, torch.set_num_threads({cfg.num_threads})" if cfg.num_threads else _NO_THREADS,
    }


# ---- Lightning ----------------------------------------------------------------------------------------


def lightning_trainer(cfg: TrialConfig) -> list[str]:
    return [
        f"    precision={_LIGHTNING_PRECISION[cfg.precision]!r},",
        f"    benchmark={cfg.cudnn_benchmark!r},  # cudnn_benchmark",
    ]


def lightning_hooks(cfg: TrialConfig) -> list[str]:
    """AutotuneHooks' channels_last: the weights in setup() (not under FSDP, whose fully_shard refuses
    channels_last parameters), the 4-D inputs after each batch moves to the device."""
    if not cfg.channels_last:
        return []
    fsdp = _strategy.fsdp_on(cfg)
    hooks = []
    if not fsdp:
        hooks += [
            "",
            "    def setup(self, stage):",
            "        # channels_last: the weights, before the strategy moves the model and wraps it in DDP",
            "        # (on_fit_start is too late: DDP's gradient buckets would keep the old strides)",
            "        super().setup(stage)",
            "        self.to(memory_format=torch.channels_last)",
        ]
    return hooks + [
        "",
        "    def on_after_batch_transfer(self, batch, dataloader_idx):",
        "        # channels_last: the 4-D inputs (images); other tensors pass through"
        + ("; under FSDP the inputs only (fully_shard refuses channels_last weights)" if fsdp else ""),
        "        def cl(x):",
        "            return x.contiguous(memory_format=torch.channels_last) "
        "if torch.is_tensor(x) and x.dim() == 4 else x",
        "        return [cl(x) for x in batch] if isinstance(batch, (list, tuple)) else cl(batch)",
    ]


def lightning_extra(cfg: TrialConfig) -> list[str]:
    """What the Trainer has no flag for, after the hooks: the thread count, compile, checkpointing."""
    extra = []
    if cfg.num_threads:
        extra.append(f"torch.set_num_threads({cfg.num_threads!r})  # num_threads, before building the DataLoader")
    extra.append(
        f"# compile={cfg.compile}: "
        + (
            "no change"
            if cfg.compile == "off"
            else f"model = torch.compile(model, mode={cfg.compile!r}) before trainer.fit(model)"
        )
    )
    extra.append(
        f"# checkpoint_segments={cfg.checkpoint_segments}: "
        + (
            "off"
            if cfg.checkpoint_segments == 0
            else f"in forward(), run the first {cfg.checkpoint_segments} encoder stages through "
            "torch.utils.checkpoint.checkpoint(stage, x, use_reentrant=False)"
        )
    )
    return extra


# ---- transformers -------------------------------------------------------------------------------------


def hf_precision(cfg: TrialConfig) -> list[str]:
    return [f"    bf16={cfg.precision == 'bf16'!r},", f"    fp16={cfg.precision == 'fp16'!r},"]


def hf_args(cfg: TrialConfig) -> list[str]:
    """gradient_checkpointing and torch_compile: the compute knobs TrainingArguments has a field for."""
    if cfg.checkpoint_segments:
        args = [
            f"    gradient_checkpointing=True,  # checkpoint_segments={cfg.checkpoint_segments}: "
            "HF checkpoints every layer, not the first k"
        ]
    else:
        args = ["    gradient_checkpointing=False,  # checkpoint_segments=0"]
    args.append(f"    torch_compile={cfg.compile != 'off'!r},  # compile={cfg.compile}")
    if cfg.compile != "off":
        args.append(f"    torch_compile_mode={cfg.compile!r},")
    return args


def hf_notes(cfg: TrialConfig) -> list[str]:
    notes = [f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark!r}  # cudnn_benchmark"]
    if cfg.num_threads:
        notes.append(f"torch.set_num_threads({cfg.num_threads!r})  # num_threads")
    notes.append(
        f"# channels_last={cfg.channels_last}: "
        + (
            "model = model.to(memory_format=torch.channels_last) before Trainer(...), and return 4-D "
            "image batches as .contiguous(memory_format=torch.channels_last) from the data collator"
            if cfg.channels_last
            else "off, nothing to do"
        )
    )
    if cfg.checkpoint_segments:
        notes.append(
            f"# checkpoint_segments={cfg.checkpoint_segments}: gradient_checkpointing needs a model with "
            "gradient_checkpointing_enable() (a transformers PreTrainedModel); it saves more memory and "
            "costs more time than autotune's first-k segments"
        )
    return notes


# ---- accelerate ---------------------------------------------------------------------------------------


def accelerate_conf(cfg: TrialConfig) -> dict[str, Any]:
    conf: dict[str, Any] = {"mixed_precision": _ACC_PRECISION[cfg.precision]}
    if cfg.compile != "off":
        conf["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": cfg.compile,
            "dynamo_use_dynamic": False,
            "dynamo_use_fullgraph": False,
        }
    return conf


def accelerate_code(cfg: TrialConfig) -> list[str]:
    """train.py's lines before the loader: cudnn, threads, the memory format, checkpointing."""
    code = [f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark!r}"]
    if cfg.num_threads:
        code.append(f"torch.set_num_threads({cfg.num_threads!r})")
    if cfg.channels_last and _strategy.fsdp_on(cfg):
        code.append(
            "# channels_last under FSDP: 4-D inputs only, in the loop (fully_shard refuses channels_last weights)"
        )
    elif cfg.channels_last:
        code.append("model = model.to(memory_format=torch.channels_last)  # and 4-D inputs likewise, in the loop")
    if cfg.checkpoint_segments:
        code.append(
            f"# checkpoint_segments={cfg.checkpoint_segments}: run the first {cfg.checkpoint_segments} "
            "blocks of forward() through torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"
        )
    return code


# ---- a script study -----------------------------------------------------------------------------------


def script_lines(cfg: TrialConfig) -> list[str]:
    """The script's cudnn and thread lines, as the trial set them."""
    out = [f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark}"]
    if cfg.num_threads:
        out.append(f"torch.set_num_threads({cfg.num_threads})")
    return out


def api_lines(cfg: TrialConfig, skip: frozenset[str], device: str) -> list[str]:
    """The at.* calls a trial set, each with the torch call it stands for without autotune."""
    out = []
    if "precision" not in skip and cfg.precision != "fp32":
        out.append(
            f"with at.autocast():  # precision={cfg.precision}: torch.autocast({device!r}, dtype={_DTYPE[cfg.precision]})"
        )
        if cfg.precision == "fp16":
            out.append(f"scaler = at.scaler()  # torch.amp.GradScaler({device!r})")
    if "channels_last" not in skip and cfg.channels_last:
        out.append("model = at.model(model)  # channels_last: model.to(memory_format=torch.channels_last)")
    if "compile" not in skip and cfg.compile != "off":
        out.append(f"model = at.model(model)  # compile: torch.compile(model, mode={cfg.compile!r})")
    return out


def edit(rw: Rewrite) -> None:
    """cudnn's autotuner and the thread count, added where the script sets neither; the at.* calls whose
    knob changed become the torch calls they stand for."""
    _globals(rw)
    cfg, skip = rw.cfg, rw.skip
    precision = "precision" not in skip and cfg.precision != rw.base.precision
    # Outside a trial at.autocast(own) and at.scaler(own) run the script's own precision (fp32 unless it
    # names one): only a measured precision that differs from it is written, as the torch call.
    if precision:
        autocast = (
            f"torch.autocast({rw.device!r}, dtype={_DTYPE[cfg.precision]})"
            if cfg.precision in _DTYPE
            else f"torch.autocast({rw.device!r}, enabled=False)"  # fp32 measured over the script's own AMP
        )
        for call in rw.api("autocast"):
            rw.replace(call, autocast)
    if precision and "fp16" in (cfg.precision, rw.base.precision):  # the scaler goes on, or off with fp16
        for call in rw.api("scaler"):
            on = "" if cfg.precision == "fp16" else ", enabled=False"
            rw.replace(call, f"torch.amp.GradScaler({rw.device!r}{on})")
    for call in rw.api("model"):
        if call.args:
            _model(rw, call)
    changed = [
        k for k in UNEDITED_ORDER if k in rw.job.routed and k not in skip and getattr(cfg, k) != getattr(rw.base, k)
    ]
    written = _model_lines(rw, changed)
    rw.model_written = written  # the alone copy applies the rest through the seams, never these again
    for knob in sorted(set(changed) - set(written)):
        rw.notes.append(f"{knob} {getattr(cfg, knob)}: {UNEDITED_HOW[knob]}; {UNEDITED_RUN}")
    gpus = LEADS["processes"]  # the table's name: the knob is read from cfg, not spelled here
    if cfg.gpus > 1 and gpus not in skip and not rw.job.uses.process_group:
        run = UNEDITED_RUN.replace("`autotune run", f"`torchrun --nproc-per-node {cfg.gpus} -m autotune run")
        rw.notes.append(f"{gpus} {cfg.gpus}: {RANKS_HOW}; {run}")


# A knob the trial applied to the model the script's optimizer trains (trial/loop/script/model.py), where no line
# of the script names that model for sure (_model_lines): the diff says it; `autotune run` applies it as measured.
UNEDITED_RUN = "`autotune run --config best.yaml SCRIPT ARGS` applies it, with no edit, as the trials did"
UNEDITED_HOW = {
    "precision": "autocast around the forward of the model the optimizer trains, its outputs back in fp32",
    "channels_last": "model.to(memory_format=torch.channels_last) on the model the optimizer trains",
    "checkpoint_segments": "torch.distributed._composable.checkpoint(block) on the model's first repeated blocks",
    "compile": "torch.compile of the forward of the model the optimizer trains, in place",
}
# The order the trial applies them in at the model's first call (trial/loop/script/model.py), the diff's too: its
# forward pre-hooks then run in the same order (the inputs made channels_last before the autocast is entered).
UNEDITED_ORDER = ("checkpoint_segments", "channels_last", "precision", "compile")
# Plain torch for each, after the statement that builds the optimizer from MODEL.parameters() ({m}: that name).
_MODEL_LINES = {
    "checkpoint_segments": [
        "from torch.distributed._composable import checkpoint as _checkpoint  # autotune: checkpoint_segments {k}",
        "for _block in {blocks!r}:",
        "    _checkpoint({m}.get_submodule(_block))",
    ],
    "channels_last": [
        # torch's own Module.to: a wrapper that overrides `to` (timm's training task) may take no memory format
        "torch.nn.Module.to({m}, memory_format=torch.channels_last)  # autotune: channels_last, its 4-D inputs too",
        "{m}.register_forward_pre_hook(lambda _m, args: tuple(a.contiguous(memory_format=torch.channels_last) "
        "if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args))",
    ],
    "precision": [
        "def _autocast_in(module, args):  # autotune: precision {p}, autocast around {m}'s forward",
        "    module._autotune_autocast = {autocast}",
        "    module._autotune_autocast.__enter__()",
        "def _autocast_out(module, args, output):  # its floating outputs back in fp32, for a loss outside it",
        "    module._autotune_autocast.__exit__(None, None, None)",
        "    low = (torch.bfloat16, torch.float16)",
        "    return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.float() if t.dtype in low else t, output)",
        "{m}.register_forward_pre_hook(_autocast_in)",
        "{m}.register_forward_hook(_autocast_out)",
    ],
    "compile": ["{m}.forward = torch.compile({m}.forward, mode={mode!r})  # autotune: compile, its forward in place"],
}
# The calls that return the module they are called on, followed back to the class it was built as.
_SAME_MODULE = frozenset({"to", "cuda", "cpu", "float", "train", "requires_grad_"})


def _model_lines(rw: Rewrite, changed: list[str]) -> list[str]:
    """The model knobs the best config changes, written as plain torch lines after the statement that builds
    the stepped optimizer from `MODEL.parameters()`, where MODEL is assigned once an instance of the class
    the trials found (Export.sites' model); the knobs written ([] where nothing names the model for sure:
    the notes say those). fp16 is not written: it needs a GradScaler the script does not have."""
    found = (rw.recorded or {}).get("model") or {}
    knobs = [k for k in changed if not (k == "precision" and rw.cfg.precision == "fp16")]
    optimizer = next((s.call for s in rw.sites("optimizers") or [] if s.used() and s.src is rw), None)
    if not knobs or not found.get("class") or optimizer is None:
        return []
    params = (
        optimizer.args[0] if optimizer.args else next((k.value for k in optimizer.keywords if k.arg == "params"), None)
    )
    if not (
        isinstance(params, ast.Call)
        and isinstance(params.func, ast.Attribute)
        and params.func.attr == "parameters"
        and isinstance(params.func.value, ast.Name)
    ):
        return []
    name = params.func.value.id
    value = source.assigned_once(rw.tree, name)
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _SAME_MODULE:
        value = value.func.value
    if not (isinstance(value, ast.Call) and rw.callee(value) == found["class"]):
        return []
    statement = _statement_of(rw.tree, optimizer)
    if statement is None or statement.end_lineno is None:
        return []
    cfg = rw.cfg
    autocast = (
        f"torch.autocast({rw.device!r}, dtype={_DTYPE[cfg.precision]})"
        if cfg.precision in _DTYPE
        else f"torch.autocast({rw.device!r}, enabled=False)"  # fp32 measured inside the script's own AMP
    )
    fields = {
        "m": name,
        "k": cfg.checkpoint_segments,
        "blocks": tuple(found.get("checkpointed") or ()),
        "p": cfg.precision,
        "autocast": autocast,
        "mode": cfg.compile,
    }
    indent = " " * statement.col_offset
    text = "".join(indent + line.format(**fields) + "\n" for k in knobs for line in _MODEL_LINES[k])
    offset = rw.starts[statement.end_lineno]
    if offset == len(rw.source) and not rw.source.endswith(b"\n"):
        text = "\n" + text
    rw.edits.append(Edit(offset, offset, text))
    return knobs


def _statement_of(tree: ast.Module, node: ast.AST) -> ast.stmt | None:
    """The innermost statement that holds `node`."""
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found: ast.AST | None = node
    while found is not None and not isinstance(found, ast.stmt):
        found = parents.get(found)
    return found


# gpus for a script that sets up no process group (trial/loop/script/ranks.py): no line of it can say that.
RANKS_HOW = (
    "one process per GPU: the process group set up, the model replicated (DDP) and the training DataLoaders "
    "given a DistributedSampler, with no edit"
)


def _globals(rw: Rewrite) -> None:
    """A trial sets cudnn.benchmark and the thread count before the script runs, so a line of the script's
    own that sets them ran after it and won; only where the script has none is one added."""
    cfg = rw.cfg
    if "cudnn_benchmark" not in rw.skip | rw.no_effect:
        assigns = [
            n
            for n in ast.walk(rw.tree)
            if isinstance(n, ast.Assign) and any(ast.unparse(t).endswith("cudnn.benchmark") for t in n.targets)
        ]
        if assigns and not all(rw.same(n.value, cfg.cudnn_benchmark) for n in assigns):
            rw.notes.append(
                f"cudnn_benchmark={cfg.cudnn_benchmark}: the script sets it itself (line {assigns[0].lineno}), "
                "after the trial did, so its own value is what ran"
            )
        if not assigns and cfg.cudnn_benchmark:
            rw.top.append("torch.backends.cudnn.benchmark = True  # autotune: cudnn_benchmark")
    if "num_threads" not in rw.skip and cfg.num_threads:
        sets = rw.calls_to("set_num_threads")
        if sets and not all(c.args and rw.same(c.args[0], cfg.num_threads) for c in sets):
            rw.notes.append(
                f"num_threads={cfg.num_threads}: the script calls torch.set_num_threads itself "
                f"(line {sets[0].lineno}), after the trial did, so its own count is what ran"
            )
        if not sets:
            rw.top.append(f"torch.set_num_threads({cfg.num_threads})  # autotune: num_threads")


def _model(rw: Rewrite, call: ast.Call) -> None:
    cfg, base, skip = rw.cfg, rw.base, rw.skip
    cl = "channels_last" not in skip and cfg.channels_last != base.channels_last
    comp = "compile" not in skip and cfg.compile != base.compile
    if not (cl or comp):
        return
    expr = rw.text(call.args[0])
    if cfg.channels_last and "channels_last" not in skip:
        expr = f"{expr}.to(memory_format=torch.channels_last)"
    if cfg.compile != "off" and "compile" not in skip:
        mode = "" if cfg.compile == "default" else f", mode={cfg.compile!r}"
        expr = f"torch.compile({expr}{mode})"
    rw.replace(call, expr)
