"""``sqe-catalog`` command line: ``serve`` runs the REST server, ``admin`` manages principals and grants."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from sqe._process import Started, nothing, run_program
from sqe._text import terminal_line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sqe-catalog", description="SQE's bundled Iceberg REST catalog")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the Iceberg REST catalog server")
    serve.add_argument("--config", required=True, help="path of catalog.toml")
    admin = sub.add_parser("admin", help="manage principals, roles, groups and grants")
    admin.add_argument("--config", required=True, help="path of catalog.toml")
    from sqe_catalog.admin import add_admin_commands

    add_admin_commands(admin)
    return parser


def run() -> NoReturn:
    """The ``sqe-catalog`` program (its console script and ``python -m sqe_catalog.cli``) as this whole process."""
    run_program(lambda started: main(started=started))


def main(argv: list[str] | None = None, *, started: Started = nothing) -> int:
    """``started``: called once start-up is over, before the server serves or an admin command runs."""
    # Imported here, not at the top: a program's start-up (``run``) covers them (see ``sqe._process``).
    from sqe_catalog.config import load_config
    from sqe_catalog.errors import CatalogError, ConfigError

    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if args.command == "serve":
            from sqe_catalog.server import serve

            serve(config, started=started)
            return 0
        from sqe_catalog.admin import run_admin_command

        started()
        return run_admin_command(config, args)
    except (ConfigError, CatalogError) as exc:
        print(f"sqe-catalog: {terminal_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    run()
