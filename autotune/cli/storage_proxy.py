"""`storage-proxy`: serve one RDB storage to a fleet's workers over gRPC."""

from __future__ import annotations

import argparse
import ipaddress
from typing import Any

from autotune.core.errors import ConfigError
from autotune.search.store.storage import open_storage, shown_storage


def register(sub: Any) -> None:
    p = sub.add_parser(
        "storage-proxy",
        help="serve a storage to workers over gRPC (Optuna's GrpcStorageProxy)",
        description="Run Optuna's gRPC storage proxy in front of one RDB storage, so a large fleet "
        "needs one database connection pool instead of one per worker. Workers use --storage grpc://HOST:PORT. "
        "The proxy has no TLS and no authentication: anyone who reaches the port can read and rewrite "
        "every study behind it. It listens on loopback only, for workers on this machine or behind an "
        "SSH tunnel, unless --trusted-network says that only trusted machines can reach --host.",
    )
    p.add_argument("--storage", required=True, help="the RDB storage URL to serve")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1); one that is not loopback needs --trusted-network",
    )
    p.add_argument("--port", type=int, default=13000, help="port (default 13000)")
    p.add_argument(
        "--trusted-network",
        action="store_true",
        help="listen on a --host that is not loopback: you vouch that every machine that can reach it may "
        "read and write the studies, and so choose the code the workers run (a private network)",
    )
    p.set_defaults(func=cmd_storage_proxy)


def cmd_storage_proxy(args: argparse.Namespace) -> int:
    import optuna  # lazy: optuna, not loaded for `autotune --help`

    _check_listen(args.host, args.port, args.trusted_network)
    storage = open_storage(args.storage)
    print(f"autotune: serving {shown_storage(args.storage)} on grpc://{args.host}:{args.port}", flush=True)
    optuna.storages.run_grpc_proxy_server(storage, host=args.host, port=args.port)
    return 0


def _check_listen(host: str, port: int, trusted: bool) -> None:
    """The proxy lets whoever reaches it rewrite a study, and so the code every worker imports: off
    loopback only when the operator says the network is trusted. Bad input before anything is opened."""
    if trusted or _loopback(host):
        return
    raise ConfigError(
        f"--host {host}: Optuna's gRPC proxy has no TLS and no authentication, and whoever reaches "
        f"{host}:{port} can make every worker run code of their choosing; listen on 127.0.0.1 and reach it "
        "through an SSH tunnel, or pass --trusted-network if only trusted machines can reach that address"
    )


def _loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (bracketed or not) or localhost; any other name or address is not loopback."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False
