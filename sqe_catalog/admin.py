"""``sqe-catalog admin ...``: manage principals, principal roles, groups and grants.

The commands open ``server.database`` directly with SQLAlchemy, so they work whether or not the server
is running (SQLite runs in WAL mode with a busy timeout; PostgreSQL handles concurrency itself). Output is
JSON on stdout for commands that answer something; ``create-principal`` and ``rotate-secret`` print the client
secret, the only place a secret is ever shown. Mutating commands print nothing on success. Errors print one
line to stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from sqe_catalog.auth import AuthStore, Principal, create_engine_for
from sqe_catalog.config import CatalogServerConfig
from sqe_catalog.errors import BadRequestError, CatalogError, ConfigError, NotFoundError

_Output = dict[str, Any] | list[dict[str, Any]] | None
_Command = Callable[[AuthStore, CatalogServerConfig, argparse.Namespace], _Output]


def add_admin_commands(parser: argparse.ArgumentParser) -> None:
    """Add the admin subcommands to the ``admin`` parser (their name lands in ``args.admin_command``)."""
    sub = parser.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")

    create = sub.add_parser("create-principal", help="create a principal; prints its client id and secret")
    create.add_argument("name")
    create.add_argument("--admin", action="store_true", help="the principal holds every privilege")
    sub.add_parser("rotate-secret", help="new client secret (older tokens stop working)").add_argument("name")
    sub.add_parser("delete-principal", help="delete a principal").add_argument("name")
    sub.add_parser("create-role", help="create a principal role").add_argument("role")
    sub.add_parser("delete-role", help="delete a principal role and its grants").add_argument("role")
    _two_names(sub, "assign-role", "give a principal a role", "principal", "role")
    _two_names(sub, "unassign-role", "take a role from a principal", "principal", "role")
    sub.add_parser("create-group", help="create a group").add_argument("group")
    _two_names(sub, "add-to-group", "add a principal to a group", "principal", "group")
    _two_names(sub, "remove-from-group", "remove a principal from a group", "principal", "group")
    _two_names(sub, "assign-group-role", "give every member of a group a role", "group", "role")
    _grant_parser(sub, "grant", "grant a privilege to a role")
    _grant_parser(sub, "revoke", "revoke a privilege from a role")
    sub.add_parser("list-principals", help="principals with their roles and groups (JSON, no secrets)")
    sub.add_parser("list-grants", help="grants (JSON)").add_argument("--role", help="only this role's grants")


def _two_names(sub: Any, name: str, help_text: str, first: str, second: str) -> None:
    parser = sub.add_parser(name, help=help_text)
    parser.add_argument(first)
    parser.add_argument(second)


def _grant_parser(sub: Any, name: str, help_text: str) -> None:
    parser = sub.add_parser(name, help=help_text)
    parser.add_argument("role")
    parser.add_argument("privilege", help="e.g. TABLE_READ_DATA")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--namespace", help="dotted namespace, e.g. sales.eu (omit for the whole warehouse)")
    parser.add_argument("--table", help="table name inside --namespace (omit for the whole namespace)")


def run_admin_command(config: CatalogServerConfig, args: argparse.Namespace) -> int:
    """Run one admin command; returns the exit code."""
    try:
        output = _run(config, args)
    except (CatalogError, ConfigError) as exc:
        return _fail(str(exc))
    except SQLAlchemyError as exc:
        return _fail(f"database error: {_describe_database_error(exc)}")
    if output is not None:
        print(json.dumps(output, indent=2, sort_keys=True))
    return 0


def _run(config: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    command = _COMMANDS.get(str(getattr(args, "admin_command", "")))
    if command is None:
        raise BadRequestError(f"unknown admin command {getattr(args, 'admin_command', None)!r}")
    engine = create_engine_for(config.server.database)
    try:
        # Admin commands never issue tokens; any non-empty key will do when the config leaves it empty.
        signing_key = config.server.token_signing_key.encode("utf-8") or secrets.token_bytes(32)
        store = AuthStore(engine, signing_key, config.server.token_lifetime_seconds)
        store.create_schema()
        return command(store, config, args)
    finally:
        engine.dispose()


def _fail(message: str) -> int:
    print(f"sqe-catalog admin: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    return 1


def _describe_database_error(exc: SQLAlchemyError) -> str:
    """The driver's first line, never SQLAlchemy's rendering (that may echo statements and parameters)."""
    orig = getattr(exc, "orig", None)
    text = str(orig) if orig is not None else type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


def _namespace(dotted: str | None) -> tuple[str, ...] | None:
    if dotted is None:
        return None
    parts = tuple(dotted.split("."))
    if not all(parts):
        raise BadRequestError(f"invalid namespace {dotted!r}: use dotted names like sales.eu")
    return parts


def _known_warehouse(config: CatalogServerConfig, name: str) -> str:
    if config.warehouse(name) is None:
        configured = ", ".join(w.name for w in config.warehouses) or "none"
        raise NotFoundError(f"unknown warehouse {name}; configured warehouses: {configured}")
    return name


def _credentials(name: str, client_id: str, client_secret: str) -> dict[str, Any]:
    return {"name": name, "client_id": client_id, "client_secret": client_secret}


def _principal_json(p: Principal) -> dict[str, Any]:
    return {
        "name": p.name,
        "client_id": p.client_id,
        "is_admin": p.is_admin,
        "roles": sorted(p.roles),
        "groups": sorted(p.groups),
    }


def _create_principal(store: AuthStore, _c: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    return _credentials(args.name, *store.create_principal(args.name, is_admin=args.admin))


def _rotate_secret(store: AuthStore, _c: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    return _credentials(args.name, *store.rotate_secret(args.name))


def _grant(store: AuthStore, config: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    warehouse = _known_warehouse(config, args.warehouse)
    store.grant(args.role, args.privilege, warehouse, _namespace(args.namespace), args.table)
    return None


def _revoke(store: AuthStore, _c: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    # No warehouse check: revoking what a since-removed warehouse left behind must stay possible.
    store.revoke(args.role, args.privilege, args.warehouse, _namespace(args.namespace), args.table)
    return None


def _list_grants(store: AuthStore, _c: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    return [g.to_json() for g in store.list_grants(args.role)]


def _list_principals(store: AuthStore, _c: CatalogServerConfig, _a: argparse.Namespace) -> _Output:
    return [_principal_json(p) for p in store.list_principals()]


def _silent(action: Callable[[AuthStore, argparse.Namespace], object]) -> _Command:
    def command(store: AuthStore, _c: CatalogServerConfig, args: argparse.Namespace) -> _Output:
        action(store, args)
        return None

    return command


_COMMANDS: dict[str, _Command] = {
    "create-principal": _create_principal,
    "rotate-secret": _rotate_secret,
    "delete-principal": _silent(lambda s, a: s.delete_principal(a.name)),
    "create-role": _silent(lambda s, a: s.create_role(a.role)),
    "delete-role": _silent(lambda s, a: s.delete_role(a.role)),
    "assign-role": _silent(lambda s, a: s.assign_role(a.principal, a.role)),
    "unassign-role": _silent(lambda s, a: s.unassign_role(a.principal, a.role)),
    "create-group": _silent(lambda s, a: s.create_group(a.group)),
    "add-to-group": _silent(lambda s, a: s.add_to_group(a.principal, a.group)),
    "remove-from-group": _silent(lambda s, a: s.remove_from_group(a.principal, a.group)),
    "assign-group-role": _silent(lambda s, a: s.assign_group_role(a.group, a.role)),
    "grant": _grant,
    "revoke": _revoke,
    "list-principals": _list_principals,
    "list-grants": _list_grants,
}
