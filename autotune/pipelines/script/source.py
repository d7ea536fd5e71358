"""What a script's source routes, read statically from its syntax tree (`ast`) before any trial: the
DataLoader, the autotune.script (at.*) calls it makes, the optimizer classes it constructs, whether it seeds
torch or sets up its own process group, and its own values (at.batch_size()'s and at.accumulation()'s
defaults, its lr, its DataLoader's batch_size, the value it gives the at.* call that routes a knob spelled
by its module's SPELLINGS: at.autocast()'s dtype), each followed through a name assigned once or an argparse
option's literal default with the script's own arguments applied.

May import: autotune.core (never torch at import).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from autotune.core import knobs

API_MODULE = "autotune.script"
# Knobs read from the arguments of at.* calls: the script's own values, the baseline's.
OWN = ("batch_size", "accumulation")
# The lr rule each optimizer family scales by (core.config.lr_factor): SGD's is linear (Goyal et al. 2017),
# adaptive methods' is sqrt (Malladi et al. 2022). An optimizer in neither keeps the default, said.
LINEAR_RULE = frozenset({"SGD"})
SQRT_RULE = frozenset(
    {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "SparseAdam", "Adagrad", "Adadelta", "RMSprop", "Adafactor",
     "Lamb", "LAMB", "FusedAdam", "FusedLAMB", "AdamW8bit", "Adam8bit"}
)  # fmt: skip
OTHER_OPTIMIZERS = frozenset({"Lion", "Rprop", "ASGD", "LBFGS", "Muon", "Shampoo", "SophiaG", "Adan"})
# Calls that set up the default process group: a script making one runs under torchrun, one process per GPU.
PROCESS_GROUP = frozenset({"init_process_group", "init_device_mesh"})
# Calls that seed torch's global generator: a script making one starts each run from the same weights.
# (A torch.Generator's manual_seed seeds only what draws from it, a sampler's order say, not the weights.)
SEEDING = frozenset({"torch.manual_seed", "torch.random.manual_seed", "seed_everything", "set_seed"})


@dataclass(frozen=True)
class Uses:
    """What a script's source routes: a DataLoader, the at.* calls it makes, the optimizer classes it
    constructs, and its own value for each of OWN (an int, or why it cannot be read)."""

    dataloader: bool
    api: frozenset[str]
    optimizers: tuple[str, ...] = ()
    # OWN's values, "lr", "loader_batch_size" (and the option it reads, "loader_batch_option"; how the lr follows
    # that option where it reads it, "lr_batch_rule": linear, sqrt or why neither) and each knob's given to the
    # at.* call that routes it (_own_spelled)
    own: tuple[tuple[str, float | str], ...] = ()
    seeded: bool = False  # it seeds torch itself (manual_seed, seed_everything, set_seed) or takes at.seed()
    process_group: bool = False  # it sets up its own process group (init_process_group, init_device_mesh)

    def own_value(self, name: str) -> Any:
        """The script's own value of an OWN call's argument (or its lr), why it cannot be read, or None:
        no such call."""
        return dict(self.own).get(name)


def scan(tree: ast.Module, args: list[str] | tuple[str, ...] = ()) -> Uses:
    """The DataLoader, the autotune.script calls, the optimizers named in a script's syntax tree, and the
    defaults its OWN calls are given (`args`: the script's command line, which its argparse reads)."""
    aliases: set[str] = set()  # names bound to the API module
    direct: dict[str, str] = {}  # local name -> API function
    group_calls = set(PROCESS_GROUP)  # and the names torch.distributed's are imported as
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "autotune":
            aliases |= {a.asname or a.name for a in node.names if a.name == "script"}
        elif isinstance(node, ast.ImportFrom) and node.module == API_MODULE:
            direct |= {a.asname or a.name: a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == API_MODULE and a.asname}
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed"):
            group_calls |= {a.asname for a in node.names if a.name in PROCESS_GROUP and a.asname}
    api: set[str] = set()
    first: dict[str, ast.Call] = {}  # API function -> its first call in the source
    optimizers: list[str] = []
    loader = seeded = process_group = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "DataLoader":
            loader = True
        if isinstance(node, ast.Attribute) and node.attr == "DataLoader":
            loader = True
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
            name = f.attr
        elif isinstance(f, ast.Attribute) and ast.unparse(f.value) == API_MODULE:
            name = f.attr
        elif isinstance(f, ast.Name) and f.id in direct:
            name = direct[f.id]
        if name is not None:
            api.add(name)
            first.setdefault(name, node)
        callee = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        seeded = seeded or _seeds_torch(f)
        process_group = process_group or callee in group_calls
        if callee in LINEAR_RULE | SQRT_RULE | OTHER_OPTIMIZERS and callee not in optimizers:
            optimizers.append(callee)
    own: list[tuple[str, float | str]] = [(k, _own_default(tree, first[k], args)) for k in OWN if k in first]
    if (lr := _lr_node(tree, first.get("lr"), optimizers)) is not None:
        own.append(("lr", _resolve(tree, lr, args, 0, float)))
    if (loader_batch := _loader_batch(tree, args)) is not None:
        own.append(("loader_batch_size", loader_batch))
    if (option := _loader_batch_option(tree)) is not None:
        own.append(("loader_batch_option", option[1]))
        if lr is not None and (rule := _batch_rule(tree, lr, option[0])) is not None:
            own.append(("lr_batch_rule", rule))
    for knob in knobs.ALL:  # a knob the script gives its own value through the at.* call that routes it
        if hasattr(knob, "SPELLINGS") and knob.ROUTE in first:
            own.append((knob.NAME, _own_spelled(tree, first[knob.ROUTE], args, knob)))
    return Uses(loader, frozenset(api), tuple(optimizers), tuple(own), seeded or "seed" in api, process_group)


def _own_spelled(tree: ast.Module, call: ast.Call, args: list[str] | tuple[str, ...], knob: ModuleType) -> str:
    """The knob's value the script runs alone, as its first call routing it is given it (its default when it
    gives none), one of the knob's VALUES; else why it cannot be read, in words."""
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "own"), None)
    return str(knob.ROW.default) if arg is None else _spelled(tree, arg, args, 0, knob)


def _spelled(tree: ast.Module, node: ast.expr, args: list[str] | tuple[str, ...], depth: int, knob: ModuleType) -> str:
    """A value as a script spells it (the knob's SPELLINGS: "bf16" or "bfloat16", torch.bfloat16), None (the
    knob's default: no autocast), a name assigned once (followed), or an argparse option's literal default
    (the script's own arguments applied)."""
    said, spellings = ast.unparse(node), knob.SPELLINGS
    if isinstance(node, ast.Constant) and node.value is None:
        return str(knob.ROW.default)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return spellings.get(node.value.lower(), f"{said} is not one of {', '.join(spellings)}")
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        if node.attr in spellings and node.attr not in knob.VALUES:  # torch.bfloat16, not torch.bf16
            return spellings[node.attr]
    if isinstance(node, ast.Name) and depth < 5:
        if (value := assigned_once(tree, node.id)) is not None:
            return _spelled(tree, value, args, depth + 1, knob)
    if isinstance(node, ast.Attribute):
        word = _argparse_default(tree, node.attr, args, str)  # the option's value, or why it has none
        if word is not None:
            return spellings.get(str(word).lower(), f"{said}: {word}")
    return f"{said!r} is not a {knob.NAME}, a name assigned once, or an argparse option's default in the source"


def _lr_node(tree: ast.Module, call: ast.Call | None, optimizers: list[str]) -> ast.expr | None:
    """The expression the script's own lr is: at.lr()'s default, else the lr its first optimizer's constructor
    is given; None: neither is given one."""
    if call is not None:
        return call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "default"), None)
    for node in ast.walk(tree):
        f = node.func if isinstance(node, ast.Call) else None
        callee = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if isinstance(node, ast.Call) and optimizers and callee == optimizers[0]:
            return next((k.value for k in node.keywords if k.arg == "lr"), node.args[1] if len(node.args) > 1 else None)
    return None


# How an lr expression follows a batch it reads: lr = base * batch / 256 is linear in it, base * sqrt(batch) sqrt.
OTHER_FORM = "in a form that is not a product with it or its square root"


def _batch_rule(tree: ast.Module, node: ast.expr, dest: str, depth: int = 0) -> str | None:
    """How `node` follows `<parsed args>.dest` (the batch option the DataLoader reads): "linear", "sqrt", why
    neither (OTHER_FORM), or None where it does not read it (names followed where assigned once)."""
    if not _reads(tree, node, dest, depth):
        return None
    if isinstance(node, ast.Attribute) and node.attr == dest:
        return "linear"
    if isinstance(node, ast.Name):
        value = assigned_once(tree, node.id)
        return OTHER_FORM if value is None else _batch_rule(tree, value, dest, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        left, right = (_batch_rule(tree, side, dest, depth) for side in (node.left, node.right))
        if isinstance(node.op, ast.Div) and right is not None:
            return OTHER_FORM  # inversely
        return left if right is None else right if left is None else OTHER_FORM
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and _number(node.right, float) == 0.5:
        return "sqrt" if _batch_rule(tree, node.left, dest, depth) == "linear" else OTHER_FORM
    if isinstance(node, ast.Call) and len(node.args) == 1 and _api_name(node) in ("sqrt", "float"):
        inner = _batch_rule(tree, node.args[0], dest, depth)
        return inner if _api_name(node) == "float" else "sqrt" if inner == "linear" else OTHER_FORM
    return OTHER_FORM


def _reads(tree: ast.Module, node: ast.expr, dest: str, depth: int) -> bool:
    """Whether `node` reads `<parsed args>.dest`, itself or through the names it reads (up to 5 deep)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr == dest:
            return True
        if (
            isinstance(n, ast.Name)
            and depth < 5
            and any(_reads(tree, v, dest, depth + 1) for v in _assigned(tree, n.id))
        ):
            return True
    return False


def _loader_batch(tree: ast.Module, args: list[str] | tuple[str, ...]) -> int | str | None:
    """The batch_size the script's first DataLoader(...) is given (torch's default 1 when it gives none),
    why it cannot be read, or None: no DataLoader call. What a script that keeps its own batch runs."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _api_name(node) == "DataLoader":
            arg = next((k.value for k in node.keywords if k.arg == "batch_size"), None)
            if arg is None and len(node.args) > 1 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
                arg = node.args[1]
            if arg is None:
                return "its DataLoader passes **kwargs" if any(k.arg is None for k in node.keywords) else 1
            return _resolve(tree, arg, args, 0, int)
    return None


def _loader_batch_option(tree: ast.Module) -> tuple[str, str] | None:
    """The dest and long flag of the argparse option the script's first DataLoader(...) takes its batch_size
    from (`batch_size=args.batch_size` -> ("batch_size", "--batch-size")), or None: a batch from anything else."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _api_name(node) == "DataLoader":
            arg = next((k.value for k in node.keywords if k.arg == "batch_size"), None)
            if arg is None and len(node.args) > 1 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
                arg = node.args[1]
            flag = _option_flag(tree, arg.attr) if isinstance(arg, ast.Attribute) else None
            return None if flag is None or not isinstance(arg, ast.Attribute) else (arg.attr, flag)
    return None


def _option_flag(tree: ast.Module, dest: str) -> str | None:
    """The long flag of the argparse option whose dest is `dest`, or None."""
    for node in ast.walk(tree):
        if (option := argparse_option(node)) is not None and option[0] == dest:
            return next((f for f in option[1] if f.startswith("--")), None)
    return None


def argparse_option(node: ast.AST) -> tuple[str, list[str]] | None:
    """An add_argument(...) call's dest and its literal flags, by argparse's rule (dest=, else the first long
    flag, else the first, dashes made underscores); None for any other node."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
        return None
    flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    named = next((k.value for k in node.keywords if k.arg == "dest"), None)
    longs = [f for f in flags if f.startswith("--")]
    if isinstance(named, ast.Constant) and isinstance(named.value, str):
        return named.value, flags
    return (longs[0] if longs else flags[0] if flags else "").lstrip("-").replace("-", "_"), flags


def _own_default(tree: ast.Module, call: ast.Call, args: list[str] | tuple[str, ...]) -> int | str:
    """The int an at.batch_size/at.accumulation call is given in the script as run alone with `args`,
    or why it cannot be read from the source."""
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "default"), None)
    if arg is None:
        return 1 if _api_name(call) == "accumulation" else f"{ast.unparse(call)} has no default"
    return _resolve(tree, arg, args, 0, int)


def _api_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _number(node: ast.expr | None, kind: type) -> Any:
    """A literal of `kind` (int, float, or str: an option's word) in the source, else None."""
    ok = (int,) if kind is int else (str,) if kind is str else (int, float)
    if isinstance(node, ast.Constant) and isinstance(node.value, ok) and not isinstance(node.value, bool):
        return kind(node.value)
    return None


def _assigned(tree: ast.Module, name: str) -> list[ast.expr]:
    """Every value the source assigns to the plain name `name`."""
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
    ]


def assigned_once(tree: ast.Module, name: str) -> ast.expr | None:
    """The value `name` is assigned, where the source assigns it exactly once (else None: which one runs
    depends on the run)."""
    values = _assigned(tree, name)
    return values[0] if len(values) == 1 else None


def _resolve(tree: ast.Module, node: ast.expr, args: list[str] | tuple[str, ...], depth: int, kind: type) -> Any:
    """A literal number, a name assigned once (followed), or `<parsed args>.dest` of an argparse option
    with a literal default (the script's own arguments applied), as `kind`; else why not, in words."""
    said = ast.unparse(node)
    if (value := _number(node, kind)) is not None:
        return value
    if isinstance(node, ast.Name) and depth < 5:
        if (value := assigned_once(tree, node.id)) is not None:
            return _resolve(tree, value, args, depth + 1, kind)
    if isinstance(node, ast.Attribute):
        got = _argparse_default(tree, node.attr, args, kind)
        if got is not None:
            return got
    return f"{said!r} is not a number, a name assigned once, or an argparse option's default in the source"


def _argparse_default(tree: ast.Module, dest: str, args: list[str] | tuple[str, ...], kind: type) -> Any:
    """The value argparse gives `dest` for the command line `args`: the option's literal default, or its
    last `--opt V` / `--opt=V` in `args`; None when no add_argument in the source names that dest."""
    for node in ast.walk(tree):
        option = argparse_option(node)
        if option is None or option[0] != dest:
            continue
        assert isinstance(node, ast.Call)
        flags = option[1]
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if not any(f.startswith("-") for f in flags):
            return f"{dest!r} is a positional argument of the script"
        value = _number(kw.get("default"), kind)
        for i, word in enumerate(args):
            for flag in flags:
                if word == flag and i + 1 < len(args):
                    value = _parse(args[i + 1], flag, kind)
                elif word.startswith(flag + "="):
                    value = _parse(word[len(flag) + 1 :], flag, kind)
        return value if value is not None else f"the option {flags[0]} has no literal default"
    return None


def _parse(word: str, flag: str, kind: type) -> Any:
    try:
        return kind(word)
    except ValueError:
        return f"{flag} {word!r} in the script's arguments is not {'an int' if kind is int else 'a number'}"


def _seeds_torch(func: ast.expr) -> bool:
    name = ast.unparse(func)
    return name in SEEDING or name.rsplit(".", 1)[-1] in ("seed_everything", "set_seed")
