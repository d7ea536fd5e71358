"""Trials that span nodes, through TorchX: one API over its local, Slurm and Kubernetes schedulers.

TorchX's `dist.ddp` component writes the torchrun line every node runs: `--nnodes N`, the c10d rendezvous
(`--rdzv-backend c10d`, `--rdzv-endpoint` on the first node's host, which each scheduler names, and
the app's own id as the rendezvous id), and the scheduler starts one copy per node: on `local_cwd`, N
process trees on this machine (simulated nodes, the tests' mode); on `slurm`, one sbatch job of N
nodes; on `kubernetes`, N pods.

The trial launcher starts `python -m autotune.trial.processes.torchx_nodes ... -- WORKER ARGS` as the trial's one
process (in place of torchrun) and treats it as it treats torchrun: waits for it with the trial's
timeout, reads its exit code and the ranks' verdict files, and kills its process groups. This
supervisor submits the app, watches it, and cancels it on every node as soon as any rank or node fails
(a verdict file that is not ok, a node that exited non-zero, the app failed), when it is signalled (the
launcher's timeout or kill, Ctrl-C) and when the controller dies (PR_SET_PDEATHSIG: SIGTERM). A
scheduler reports a multi-node app as running while any node still runs, and a node left waiting in a
rendezvous or a collective would wait for minutes: this watch is what ends it within seconds.

Each node asks its scheduler for what the trial needs: its GPUs (one per rank, when the controller sees
CUDA: the study's fingerprint says GPUs), CPUs and memory (this machine's, as the fingerprint assumes;
`--scheduler-arg cpu=N` and `memMB=N` choose others), and, where nodes run a container image,
`--scheduler-arg image=IMAGE`. TorchX's own defaults (2 CPUs, no GPU, 1 GiB) would run the trial on a
node's CPU, or have it OOM-killed. On GPUs each node first runs `python -m autotune.trial.processes.torchx_nodes
node`: on local_cwd it gives each simulated node its own GPUs (CUDA_VISIBLE_DEVICES; else every node's
local rank 0 takes cuda:0, and NCCL refuses two ranks on one device), and on every scheduler it refuses a
node that sees fewer CUDA devices than its ranks, rather than let it measure the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.core.errors import ConfigError, ExitCode, exit_code_for
from autotune.core.files import write_json_atomic
from autotune.core.procs import CONTROLLER_ENV
from autotune.core.outcomes import Reason
from autotune.trial.processes.placement import Placement
from autotune.trial.processes.warm_client import EXPECT_CUDA_ENV

LOCAL = "local_cwd"  # nodes simulated as process trees on this machine (and the scheduler tests use)
POLL_S = 0.5
REMOTE_POLL_S = 5.0  # a cluster's scheduler answers each status with a query to its controller (squeue, sacct)
RDZV_PORT = 29500  # on the first node's host, for schedulers that place nodes on other hosts
LOG_DIR = "nodes"  # under the trial's folder: each node's own log, appended to trial.log at the end
# Schedulers whose nodes see this machine's files (itself, or a cluster's shared file system): they run
# this interpreter in the working directory. Every other one runs each node from an image, named by the user.
HOST_FILES = frozenset({LOCAL, "slurm"})
# dist.ddp's per-node settings, given as --scheduler-arg KEY=VALUE beside the scheduler's run options.
NODE_SETTINGS = ("image", "cpu", "memMB")
NODE_CHECK_CAUSE = "node_without_cuda"  # the "cause" in the verdict of a node that refused to run


class TorchX:
    name = "torchx"

    def check(self, placement: Placement) -> None:
        try:
            from torchx.schedulers import get_scheduler_factories
        except ImportError:
            raise ConfigError(
                "--launcher torchx: torchx is not installed (pip install 'autotune[multinode]')"
            ) from None
        known = sorted(get_scheduler_factories())
        if placement.scheduler is None:
            raise ConfigError(f"--launcher torchx needs --scheduler, one of {'|'.join(known)}")
        if placement.scheduler not in known:
            raise ConfigError(f"--scheduler {placement.scheduler!r}: not a TorchX scheduler ({'|'.join(known)})")
        _check_node_settings(placement)
        _check_run_opts(placement)
        _check_node_count(placement)

    def command(self, placement: Placement, gpus: int, trial_dir: Path, worker: list[str]) -> list[str]:
        args = [f"--scheduler-arg={k}={v}" for k, v in placement.scheduler_args]
        cuda = ["--cuda"] if expect_cuda() else []
        return [sys.executable, "-m", "autotune.trial.processes.torchx_nodes", "--nodes", str(placement.nodes),
                "--gpus", str(gpus), *cuda, "--scheduler", str(placement.scheduler), "--trial-dir", str(trial_dir),
                *args, "--", *worker]  # fmt: skip


def expect_cuda() -> bool:
    """Whether a trial's nodes must run on GPUs: when this (controller) process sees CUDA, as the study's
    fingerprint records it; AUTOTUNE_EXPECT_CUDA=1 or 0 says so explicitly (a controller on a login node
    without GPUs, for a cluster's GPU nodes)."""
    explicit = os.environ.get(EXPECT_CUDA_ENV, "").strip()
    if explicit in ("0", "1"):
        return explicit == "1"
    import torch  # a search's controller has imported it already, to fingerprint the hardware

    return bool(torch.cuda.is_available())


def _check_node_settings(placement: Placement) -> None:
    settings = dict(placement.scheduler_args)
    for key in ("cpu", "memMB"):
        if key in settings and not (settings[key].isdigit() and int(settings[key]) >= 1):
            raise ConfigError(f"--scheduler-arg {key}={settings[key]}: must be a whole number >= 1 (per node)")
    if "image" in settings and not settings["image"].strip():
        raise ConfigError("--scheduler-arg image= is empty: name the image the nodes run")
    if placement.scheduler not in HOST_FILES and "image" not in settings:
        raise ConfigError(
            f"--scheduler {placement.scheduler} runs each node from an image, not this machine's files: "
            "name it with --scheduler-arg image=IMAGE (a container image with autotune, torch and the "
            "pipeline installed)"
        )


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """TorchX's local scheduler installs SIGTERM and SIGINT handlers when it is made: not in a controller."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            if handler is not None:
                signal.signal(s, handler)


def _check_run_opts(placement: Placement) -> None:
    from torchx.runner import get_runner

    try:
        with _signals_kept(), get_runner() as runner:
            opts = runner.scheduler_run_opts(str(placement.scheduler))
    except ImportError as e:  # kubernetes without its client, ...
        raise ConfigError(f"--scheduler {placement.scheduler}: {e}") from None
    for key, _ in placement.scheduler_args:
        if key not in NODE_SETTINGS and opts.get(key) is None:
            raise ConfigError(
                f"--scheduler-arg {key}: not a {placement.scheduler} run option "
                f"({', '.join(sorted([*(name for name, _ in opts), *NODE_SETTINGS]))})"
            )


def _check_node_count(placement: Placement) -> None:
    """A node count the scheduler cannot provide is bad input (where it can be known beforehand)."""
    n, scheduler = placement.nodes, placement.scheduler
    if scheduler == LOCAL:
        cpus = len(os.sched_getaffinity(0))
        if n > cpus:
            raise ConfigError(f"--nodes {n}: {LOCAL} simulates each node on this machine, which has {cpus} CPU(s)")
    elif scheduler == "slurm":
        if shutil.which("sbatch") is None:
            raise ConfigError("--scheduler slurm: sbatch not found (run autotune where Slurm's commands are)")
        total = _slurm_nodes(dict(placement.scheduler_args).get("partition"))
        if total is not None and n > total:
            raise ConfigError(f"--nodes {n}: the Slurm partition has {total} node(s)")


def _slurm_nodes(partition: str | None) -> int | None:
    cmd = ["sinfo", "--noheader", "--format=%D", *([f"--partition={partition}"] if partition else [])]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
        return sum(int(line) for line in out.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None  # cannot tell: the scheduler will say


# --- the supervisor: `python -m autotune.trial.processes.torchx_nodes` -------------------------------------


def app_def(
    nodes: int,
    gpus: int,
    scheduler: str,
    worker: list[str],
    rdzv_port: int,
    *,
    cuda: bool = False,
    settings: dict[str, str] | None = None,
) -> Any:
    """dist.ddp's AppDef: torchrun on every node, N x G ranks, c10d rendezvous keyed by the app id, each
    node asking for its G GPUs (when `cuda`), CPUs and memory. Where nodes see this machine's files the
    ranks run this interpreter's torch (`python -m torch.distributed.run`, not whatever `torchrun` is on
    PATH); from an image, the image's own is all there is. `settings`: NODE_SETTINGS given by the user."""
    from torchx.components import dist

    settings = settings or {}
    host = scheduler in HOST_FILES
    cpu, mem_mb = _node_share(nodes if scheduler == LOCAL else 1, settings)
    env = {k: v for k, v in os.environ.items() if k.startswith("AUTOTUNE_") or k == "PYTHONPATH"}
    app = dist.ddp(*worker, m="autotune.trial", j=f"{nodes}x{gpus}", rdzv_port=rdzv_port, env=env,
                   image=settings.get("image") or os.getcwd(), name="autotune-trial",
                   cpu=cpu, gpu=gpus if cuda else 0, memMB=mem_mb)  # fmt: skip
    role = app.roles[0]
    if host and role.args[1].startswith("torchrun "):
        role.args[1] = f"{shlex.quote(sys.executable)} -m torch.distributed.run " + role.args[1][len("torchrun ") :]
    if cuda:
        _check_each_node(role, nodes, gpus, scheduler, worker)
    return app


def _node_share(share: int, settings: dict[str, str]) -> tuple[int, int]:
    """CPUs and MB of memory per node: as given, else this machine's (the study's fingerprint takes the
    nodes to be like it), split between the nodes that simulate on it."""
    import psutil

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    mem_mb = psutil.virtual_memory().total // 2**20
    cpu = int(settings["cpu"]) if settings.get("cpu") else max(1, cpus // share)
    return cpu, int(settings["memMB"]) if settings.get("memMB") else max(1, mem_mb // share)


def _check_each_node(role: Any, nodes: int, gpus: int, scheduler: str, worker: list[str]) -> None:
    """Run every node's torchrun line through `node_main` (below): it gives a simulated node its own GPUs
    and refuses a node without them. The scheduler fills in each node's ${replica_id}."""
    from torchx.specs import macros

    python = sys.executable if scheduler in HOST_FILES else "python3"  # the image's
    devices = ["--devices", ";".join(local_devices(nodes, gpus))] if scheduler == LOCAL else []
    out = ["--out", worker[worker.index("--out") + 1]] if "--out" in worker[:-1] else []
    role.args = ["-m", "autotune.trial.processes.torchx_nodes", "node", "--replica", macros.replica_id, "--gpus", str(gpus),
                 *devices, *out, "--", role.entrypoint, *role.args]  # fmt: skip
    role.entrypoint = python


def local_devices(nodes: int, gpus: int) -> list[str]:
    """Each simulated node's CUDA_VISIBLE_DEVICES: the next `gpus` of this process's own devices (a worker
    given GPUs 4-7 keeps its trials on them). Where too few are visible, the last nodes get what is left,
    and refuse to run."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        ids = [str(i) for i in range(nodes * gpus)]
    else:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
    return [",".join(ids[r * gpus : (r + 1) * gpus]) for r in range(nodes)]


def node_main(argv: list[str]) -> int:
    """One node, before its torchrun: take this node's GPUs, check that CUDA sees them, then exec the rest."""
    p = argparse.ArgumentParser(prog="python -m autotune.trial.processes.torchx_nodes node")
    p.add_argument("--replica", type=int, required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--devices", default=None, help="each node's CUDA_VISIBLE_DEVICES, ';' between nodes")
    p.add_argument("--out", type=Path, default=None, help="rank 0's verdict file: a refusal is written beside it")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.devices is not None:
        per_node = args.devices.split(";")
        os.environ["CUDA_VISIBLE_DEVICES"] = per_node[args.replica] if args.replica < len(per_node) else ""
    seen = _cuda_count()
    if seen < args.gpus:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        message = (
            f"node {args.replica} sees {seen} CUDA device(s) for its {args.gpus} rank(s) "
            f"(CUDA_VISIBLE_DEVICES={'unset' if shown is None else repr(shown)}), though the study was "
            "fingerprinted on GPUs: refused, rather than measured on the CPU"
        )
        if args.out is not None:
            with contextlib.suppress(OSError):  # a node that does not share the trial's folder (a pod)
                verdict = {"status": Reason.ERROR, "message": message, "cause": NODE_CHECK_CAUSE}
                write_json_atomic(args.out.with_name(f"{args.out.name}.node{args.replica}"), verdict)
        print(f"autotune: error: {message}", file=sys.stderr, flush=True)
        return int(exit_code_for("error"))
    sys.stdout.flush()
    os.execvp(command[0], command)
    return int(ExitCode.ERROR)  # not reached: exec replaces this process


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failed_verdict(trial_dir: Path) -> str | None:
    """The status of a rank's verdict that is not ok (any rank, any node: the trial folder is shared)."""
    for path in sorted(trial_dir.glob("result.json*")):
        try:
            status = json.loads(path.read_text()).get("status")
        except (OSError, ValueError, AttributeError):
            continue  # being written (atomically, so rarely seen) or gone
        if status != "ok":
            return str(status)
    return None


def failed_node(status: Any, local_replicas: list[Any]) -> str | None:
    """A node that ended with a failure while the app still runs: from the scheduler's per-replica states
    where it reports them (Slurm, Kubernetes), else from the local scheduler's own replica processes."""
    for role in getattr(status, "roles", None) or ():
        for replica in role.replicas:
            if str(replica.state.name) in ("FAILED", "CANCELLED"):
                return f"node {replica.id} {replica.state.name.lower()}"
    for replica in local_replicas:
        code = replica.proc.poll()
        if code is not None and code != 0:
            return f"node {replica.replica_id} exited with {code}"
    return None


def local_replicas(runner: Any, handle: str) -> list[Any]:
    """The local scheduler's replicas (one per simulated node, each holding its Popen). It reports no
    per-replica state, and reaps them itself (so their exit codes are nowhere else): read from its table,
    which is TorchX's private state (0.7). Any other shape finds none, and the verdict files and the app's
    own state are what is left to watch."""
    try:
        from torchx.specs import parse_app_handle

        app = runner._scheduler_instances[LOCAL]._apps[parse_app_handle(handle).app_id]
        return [r for replicas in app.role_replicas.values() for r in replicas]
    except (AttributeError, KeyError, TypeError):
        return []


def watch(runner: Any, handle: str, trial_dir: Path, local: bool, say: Any = print) -> int:
    """Poll the app until it ends or any part of it fails; the exit code to end the supervisor with."""
    replicas = local_replicas(runner, handle) if local else []
    while True:
        status = runner.status(handle)
        verdict = failed_verdict(trial_dir)
        if verdict is not None:
            say(f"autotune: a rank failed ({verdict}); cancelling the trial on every node")
            return int(exit_code_for(verdict))
        if status is None or status.is_terminal():
            state = "gone" if status is None else status.state.name
            return 0 if state == "SUCCEEDED" else int(ExitCode.ERROR)
        node = failed_node(status, replicas)
        if node is not None:
            say(f"autotune: {node}; cancelling the trial on every node")
            return int(ExitCode.ERROR)
        time.sleep(POLL_S if local else REMOTE_POLL_S)


def _stop(signum: int, frame: Any) -> None:
    for s in (signal.SIGTERM, signal.SIGINT):  # one is enough: the cancel that follows must not be cut short
        signal.signal(s, signal.SIG_IGN)
    raise KeyboardInterrupt


def _die_on_sigterm_with_parent() -> None:
    """The controller's death SIGTERMs this process (not SIGKILL: it must cancel the app on the nodes)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _append_logs(log_dir: Path) -> None:
    """Each node's log (the agent's and, teed, its ranks') into this process's output: the trial log."""
    for path in sorted(log_dir.glob("*/*/*/*/combined.log")):
        sys.stdout.write(f"--- {path.parent.parent.name} node {path.parent.name} ({path}) ---\n")
        sys.stdout.write(path.read_text(errors="replace"))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["node"]:
        return node_main(argv[1:])
    p = argparse.ArgumentParser(
        prog="python -m autotune.trial.processes.torchx_nodes", description="Run one trial on nodes."
    )
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--cuda", action="store_true", help="the study runs on GPUs: each node asks for, and needs, its own")
    p.add_argument("--scheduler", required=True)
    p.add_argument("--trial-dir", type=Path, required=True)
    p.add_argument("--scheduler-arg", action="append", default=[])
    p.add_argument("worker", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    _die_on_sigterm_with_parent()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, _stop)
    local = args.scheduler == LOCAL
    if not local:  # a rank on another host would take the controller's pid for a dead process
        os.environ.pop(CONTROLLER_ENV, None)
    worker = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
    pairs = [a.partition("=")[::2] for a in args.scheduler_arg]
    settings = {k: v for k, v in pairs if k in NODE_SETTINGS}
    cfg = _run_cfg(args.scheduler, [f"{k}={v}" for k, v in pairs if k not in NODE_SETTINGS])
    log_dir = args.trial_dir / LOG_DIR
    if local:
        cfg.setdefault("log_dir", str(log_dir))
    port = _free_port() if local else RDZV_PORT
    app = app_def(args.nodes, args.gpus, args.scheduler, worker, port, cuda=args.cuda, settings=settings)
    if local and args.cuda:  # each node sets its own CUDA_VISIBLE_DEVICES: TorchX's warning that none does is wrong
        logging.getLogger("torchx.schedulers.local_scheduler").addFilter(
            lambda record: "auto_set_cuda_visible_devices" not in record.getMessage()
        )
    return _run(app, args.scheduler, cfg, args.trial_dir, local, log_dir)


def _run_cfg(scheduler: str, pairs: list[str]) -> dict[str, Any]:
    """The scheduler's run options, typed as it declares them (--scheduler-arg values are strings)."""
    from torchx.runner import get_runner

    with get_runner() as runner:
        return dict(runner.scheduler_run_opts(scheduler).cfg_from_str(",".join(pairs))) if pairs else {}


def _run(app: Any, scheduler: str, cfg: dict[str, Any], trial_dir: Path, local: bool, log_dir: Path) -> int:
    from torchx.runner import get_runner

    code = int(ExitCode.INTERRUPTED)
    with get_runner() as runner:  # closing it ends what is still running of its apps
        handle = None
        try:
            handle = runner.run(app, scheduler, cfg)
            for s in (signal.SIGTERM, signal.SIGINT):  # the local scheduler installed its own meanwhile
                signal.signal(s, _stop)
            print(f"autotune: {app.roles[0].num_replicas} node(s) started as {handle}", flush=True)
            code = watch(runner, handle, trial_dir, local)
        except KeyboardInterrupt:
            print("autotune: stopped; cancelling the trial on every node", flush=True)
        finally:
            if handle is not None:
                with contextlib.suppress(Exception):
                    runner.cancel(handle)
            if local:
                _append_logs(log_dir)
    return code


if __name__ == "__main__":
    sys.exit(main())
