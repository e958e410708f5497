"""``sqe stack up|down|status --dir DIR``: the local stack from the command line.

``sqe.cli`` dispatches ``sqe stack ...`` here as ``main(argv)``; the return value is the exit status.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqe._text import terminal_line
from sqe_stack import STORES, ExternalStore, StackError, StackInfo, stack_status, start_stack, stop_stack
from sqe_stack.external import external_store


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sqe stack",
        description="Run the local S3 + STS store, sqe-catalog and the SQE server as background processes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the store, the catalog and the SQE server, write DIR/stack.json")
    up.add_argument("--dir", required=True, type=Path, help="directory for state, logs and config files")
    up.add_argument(
        "--store",
        choices=STORES,
        default="moto",
        help="moto (default, pure Python), ceph (Ceph RGW: enforces session policies) or external (a store "
        "that is already running: --s3-endpoint, --role-arn, the catalog's key in AWS_ACCESS_KEY_ID/"
        "AWS_SECRET_ACCESS_KEY or --key-file)",
    )
    _add_external_flags(up)
    for flag, minimum, default, metavar, text in (
        (
            "--credential-lifetime",
            1,
            3600,
            "SECONDS",
            "lifetime of vended credentials (default 3600; Ceph and moto accept a few seconds)",
        ),
        ("--workers", 0, 0, "N", "start N scan workers for the SQE server (default 0: the server scans in-process)"),
    ):
        up.add_argument(flag, type=_int_at_least(minimum), default=default, metavar=metavar, help=text)
    up.add_argument("--no-server", action="store_true", help="do not start the SQE server (sqe serve)")
    for name, text in (
        ("down", "stop the processes recorded in DIR/stack.json"),
        ("status", "show whether the stack's processes are alive; exit 1 if any is not"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--dir", required=True, type=Path, help="directory given to `sqe stack up`")
    return parser


def _add_external_flags(up: argparse.ArgumentParser) -> None:
    group = up.add_argument_group("--store external (see sqe_stack.external)")
    group.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint of the running store")
    group.add_argument("--sts-endpoint", metavar="URL", help="its STS endpoint (default: the S3 endpoint)")
    group.add_argument("--role-arn", metavar="ARN", help="role the catalog assumes to vend credentials")
    group.add_argument(
        "--key-file", type=Path, metavar="PATH", help="KEY=VALUE file with the catalog's AWS_* key (default: env)"
    )


def _external(args: argparse.Namespace) -> ExternalStore | None:
    """The external store the flags name; the flags are refused with any other store."""
    flags = (args.s3_endpoint, args.sts_endpoint, args.role_arn, args.key_file)
    if args.store != "external":
        if any(f is not None for f in flags):
            raise StackError("--s3-endpoint, --sts-endpoint, --role-arn and --key-file need --store external")
        return None
    return external_store(
        args.s3_endpoint, sts_endpoint=args.sts_endpoint, role_arn=args.role_arn, key_file=args.key_file
    )


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for whole numbers of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def _print_endpoints(info: StackInfo) -> None:
    print(f"  s3 endpoint   {info.s3_endpoint or '-'}")
    print(f"  sts endpoint  {info.sts_endpoint or '-'}")
    print(f"  catalog       {info.catalog_uri or '-'}  (warehouse {info.warehouse}, bucket {info.bucket})")
    if info.server_url:
        workers = f"{len(info.workers)} workers" if info.workers else "in-process scans"
        print(f"  sqe server    {info.server_url}  (reader sqe-engine, {workers}; `sqe --server {info.server_url}`)")
    for name, principal in info.principals.items():
        print(f"  principal {name:<10} config {principal.config}")


def _up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.workers and args.no_server:
        raise StackError("--workers needs the server (drop --no-server)")
    info = start_stack(
        args.dir,
        store=args.store,
        credential_lifetime=args.credential_lifetime,
        external=_external(args),
        serve=not args.no_server,
        workers=args.workers,
    )
    store_s = info.timings.get("store_ready_s")
    took = time.monotonic() - t0
    print(f"{info.store} stack up in {took:.1f} s (store answering after {store_s} s): {info.dir}")
    for name, pid in info.pids.items():
        print(f"  {name:<10} pid {pid}")
    _print_endpoints(info)
    if info.store == "ceph":
        print("  pyarrow clients need AWS_REQUEST_CHECKSUM_CALCULATION=WHEN_REQUIRED (see quickstart/ceph)")
    if info.store == "external":
        print("  the external store keeps running after `sqe stack down` (it was not started here)")
    print(f"stop it with: sqe stack down --dir {info.dir}")
    return 0


def _down(args: argparse.Namespace) -> int:
    outcome = stop_stack(args.dir)
    for name, what in outcome.items():
        print(f"  {name:<10} {what}")
    print(f"stack in {Path(args.dir).resolve()} stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    info, alive = stack_status(args.dir)
    print(f"{info.store} stack in {info.dir}: {info.state} (started {info.started_at})")
    for name, pid in info.pids.items():
        print(f"  {name:<10} pid {pid:<8} {'alive' if alive[name] else 'not running'}")
    _print_endpoints(info)
    return 0 if alive and all(alive.values()) else 1


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help or a usage error, already printed by argparse
        return exc.code if isinstance(exc.code, int) else 2
    handlers = {"up": _up, "down": _down, "status": _status}
    try:
        return handlers[args.command](args)
    except StackError as exc:
        print(f"sqe stack {args.command}: {terminal_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"sqe stack {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
