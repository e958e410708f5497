"""``sqe-catalog admin ...``: manage principals, principal roles, groups, grants and read-restrictions.

The commands open ``server.database`` directly with SQLAlchemy, so they work whether or not the server
is running (SQLite runs in WAL mode with a busy timeout; PostgreSQL handles concurrency itself). Output is
JSON on stdout for commands that answer something; ``create-principal`` and ``rotate-secret`` print the client
secret, the only place a secret is ever shown. Mutating commands print nothing on success. Errors print one
line to stderr and exit 1. Python tools (the local stack, the test fixtures) call the same code without the CLI:
``open_auth_store`` (principals, roles, grants) and ``set_restrictions``.

Read-restrictions (see ``sqe_catalog.restrictions`` for how entries combine and are served)::

    set-restrictions --warehouse W --namespace a.b --table T (--principal P | --group G) --file F [--unchecked]
    clear-restrictions --warehouse W --namespace a.b --table T (--principal P | --group G)
    list-restrictions [--warehouse W] [--namespace a.b]

Readers (engine service identities trusted to enforce restrictions for the end users they act for; see
``sqe_catalog.delegation``). No principal is a reader unless an administrator makes it one; a reader needs no
data grants of its own::

    create-principal NAME --reader           (a new reader; prints its client id and secret once)
    set-trusted-reader P true|false          (add or remove reader status of an existing principal)
    list-readers
    list-untrusted-readers                   (every principal that is not a reader)

Tag-based policies (``sqe_catalog.policies``; served only with ``[server] read_restriction_policies = true``,
managed and previewed either way)::

    create-policy --warehouse W NAME --type system_row_filter|system_column_mask --expression E [--comment C]
    update-policy --warehouse W NAME [--expression E] [--comment C]
    enable-policy / disable-policy / delete-policy / show-policy --warehouse W NAME
    list-policies --warehouse W
    attach-policy / detach-policy --warehouse W NAME --tag T [--value V]   (no --value: ALL_VALUES)
    set-tag / remove-tag --warehouse W [--namespace a.b [--table T [--column C]]] --tag T [--value V]
    list-tags --warehouse W
    preview-restrictions --warehouse W --user U --table a.b.T [--enabled-only]

``set-restrictions`` reads the table's current metadata (with the warehouse's own key) and validates the
document against its schema with SQE's parser; ``--file -`` reads standard input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from sqe._text import terminal_line
from sqe_catalog.auth import AuthStore, Grant, Principal, Privilege, create_engine_for
from sqe_catalog.config import CatalogServerConfig
from sqe_catalog.errors import (
    BadRequestError,
    CatalogError,
    ConfigError,
    NoSuchTableError,
    NotFoundError,
    describe_database_error,
)
from sqe_catalog.restrictions import RestrictionStore, Subject, SubjectKind, parse_restrictions_text
from sqe_catalog.tables import WarehouseTables, validate_namespace, validate_table_name

_Output = dict[str, Any] | list[dict[str, Any]] | list[str] | None
_Command = Callable[[AuthStore, CatalogServerConfig, argparse.Namespace], _Output]
_RestrictionCommand = Callable[[RestrictionStore, Engine, CatalogServerConfig, argparse.Namespace], _Output]


def add_admin_commands(parser: argparse.ArgumentParser) -> None:
    """Add the admin subcommands to the ``admin`` parser (their name lands in ``args.admin_command``)."""
    sub = parser.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")

    create = sub.add_parser("create-principal", help="create a principal; prints its client id and secret")
    create.add_argument("name")
    create.add_argument("--admin", action="store_true", help="the principal holds every privilege")
    create.add_argument("--reader", action="store_true", help="an engine service identity trusted to act for end users")
    sub.add_parser("rotate-secret", help="new client secret (older tokens stop working)").add_argument("name")
    sub.add_parser("delete-principal", help="delete a principal").add_argument("name")
    sub.add_parser("create-role", help="create a principal role").add_argument("role")
    sub.add_parser("delete-role", help="delete a principal role and its grants").add_argument("role")
    _two_names(sub, "assign-role", "give a principal a role", "principal", "role")
    _two_names(sub, "unassign-role", "take a role from a principal", "principal", "role")
    sub.add_parser("create-group", help="create a group").add_argument("group")
    sub.add_parser("delete-group", help="delete a group (its members keep their own roles)").add_argument("group")
    _two_names(sub, "add-to-group", "add a principal to a group", "principal", "group")
    _two_names(sub, "remove-from-group", "remove a principal from a group", "principal", "group")
    _two_names(sub, "assign-group-role", "give every member of a group a role", "group", "role")
    _two_names(sub, "unassign-group-role", "take a group's role from its members", "group", "role")
    _grant_parser(sub, "grant", "grant a privilege to a role")
    _grant_parser(sub, "revoke", "revoke a privilege from a role")
    sub.add_parser("list-principals", help="principals with their roles and groups (JSON, no secrets)")
    sub.add_parser("list-grants", help="grants (JSON)").add_argument("--role", help="only this role's grants")
    trust = sub.add_parser("set-trusted-reader", help="add (true) or remove (false) a principal's reader status")
    trust.add_argument("principal")
    trust.add_argument("trusted", choices=["true", "false"])
    sub.add_parser("list-readers", help="reader principals (JSON)")
    sub.add_parser("list-untrusted-readers", help="principals that are not readers (JSON)")
    _restriction_parsers(sub)
    _integrity_parsers(sub)
    _policy_parsers(sub)


def _integrity_parsers(sub: Any) -> None:
    for name, help_text in (
        ("list-cleanup-tasks", "purge cleanup tasks with their status and copied trusted state (JSON)"),
        ("list-integrity-events", "admission audit events: actor, table, displaced and new pointer + digest (JSON)"),
        ("run-cleanup", "run the pending cleanup tasks of a warehouse (failed tasks are never retried)"),
    ):
        sub.add_parser(name, help=help_text).add_argument("--warehouse", help="only this warehouse")


def _restriction_parsers(sub: Any) -> None:
    attach = sub.add_parser("set-restrictions", help="attach a read-restrictions object to a table for a subject")
    _restriction_target(attach)
    attach.add_argument("--file", required=True, help="JSON file with the read-restrictions object ('-': stdin)")
    attach.add_argument(
        "--unchecked",
        action="store_true",
        help="store without validation (only to test that readers fail closed; served verbatim and alone)",
    )
    _restriction_target(sub.add_parser("clear-restrictions", help="remove a subject's read-restrictions"))
    listing = sub.add_parser("list-restrictions", help="read-restrictions entries (JSON)")
    listing.add_argument("--warehouse")
    listing.add_argument("--namespace", help="dotted namespace")


def _restriction_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--namespace", required=True, help="dotted namespace, e.g. sales.eu")
    parser.add_argument("--table", required=True)
    subject = parser.add_mutually_exclusive_group(required=True)
    subject.add_argument("--principal")
    subject.add_argument("--group")


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
        return _fail(f"database error: {describe_database_error(exc)}")
    if output is not None:
        print(json.dumps(output, indent=2, sort_keys=True))
    return 0


def _run(config: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    name = str(getattr(args, "admin_command", ""))
    command = _COMMANDS.get(name)
    restriction_command = _RESTRICTION_COMMANDS.get(name)
    if name in _INTEGRITY_COMMANDS:
        return _run_integrity(config, name, args)
    if name in _POLICY_COMMANDS:
        return _run_policy(config, name, args)
    if command is None and restriction_command is None:
        raise BadRequestError(f"unknown admin command {getattr(args, 'admin_command', None)!r}")
    if restriction_command is not None:
        with _open_restriction_store(config) as (restrictions, engine):
            return restriction_command(restrictions, engine, config, args)
    assert command is not None
    with open_auth_store(config) as store:
        return command(store, config, args)


@contextlib.contextmanager
def _open_stores(config: CatalogServerConfig) -> Iterator[tuple[AuthStore, Engine]]:
    engine = create_engine_for(config.server.database)
    try:
        # Admin commands never issue tokens; any non-empty key will do when the config leaves it empty.
        signing_key = config.server.signing_key_bytes() or secrets.token_bytes(32)
        store = AuthStore(
            engine, signing_key, config.server.token_lifetime_seconds, scrypt_n=config.server.secret_hash_scrypt_n
        )
        store.create_schema()
        yield store, engine
    finally:
        engine.dispose()


@contextlib.contextmanager
def open_auth_store(config: CatalogServerConfig) -> Iterator[AuthStore]:
    """The principals/roles/grants store on ``server.database`` exactly as the admin commands open it (schema
    created); the database engine is disposed on exit. For tools that manage principals from Python."""
    with _open_stores(config) as (store, _engine):
        yield store


@contextlib.contextmanager
def _open_restriction_store(config: CatalogServerConfig) -> Iterator[tuple[RestrictionStore, Engine]]:
    """The read-restrictions store on ``server.database`` (its schema and the principals' created), with its
    database engine (to load tables); disposed on exit."""
    with _open_stores(config) as (_store, engine):
        restrictions = RestrictionStore(engine)
        restrictions.create_schema()
        yield restrictions, engine


def _fail(message: str) -> int:
    print(f"sqe-catalog admin: {terminal_line(message) or 'failed'}", file=sys.stderr)
    return 1


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
        "reader": p.is_reader,
        "roles": sorted(p.roles),
        "groups": sorted(p.groups),
    }


def _create_principal(store: AuthStore, _c: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    return _credentials(args.name, *store.create_principal(args.name, is_admin=args.admin, reader=args.reader))


def _rotate_secret(store: AuthStore, _c: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    return _credentials(args.name, *store.rotate_secret(args.name))


def _grant(store: AuthStore, config: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    warehouse = _known_warehouse(config, args.warehouse)
    store.grant(args.role, args.privilege, warehouse, _namespace(args.namespace), args.table)
    return None


def _revoke(store: AuthStore, _c: CatalogServerConfig, args: argparse.Namespace) -> _Output:
    # No warehouse check: revoking what a since-removed warehouse left behind must stay possible.
    grant = Grant(args.role, Privilege.parse(args.privilege), args.warehouse, _namespace(args.namespace), args.table)
    store.revoke(grant)
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
    "delete-group": _silent(lambda s, a: s.delete_group(a.group)),
    "add-to-group": _silent(lambda s, a: s.add_to_group(a.principal, a.group)),
    "remove-from-group": _silent(lambda s, a: s.remove_from_group(a.principal, a.group)),
    "assign-group-role": _silent(lambda s, a: s.assign_group_role(a.group, a.role)),
    "unassign-group-role": _silent(lambda s, a: s.unassign_group_role(a.group, a.role)),
    "grant": _grant,
    "revoke": _revoke,
    "list-principals": _list_principals,
    "list-grants": _list_grants,
    "set-trusted-reader": _silent(lambda s, a: s.set_reader(a.principal, a.trusted == "true")),
    "list-readers": lambda s, _c, _a: s.list_readers(),
    "list-untrusted-readers": lambda s, _c, _a: [p.name for p in s.list_principals() if not p.is_reader],
}


# ----------------------------------------------------------------------------------------------------
# Integrity (sqe_catalog.integrity): cleanup tasks and admission events

_INTEGRITY_COMMANDS = ("list-cleanup-tasks", "list-integrity-events", "run-cleanup")


def _run_integrity(config: CatalogServerConfig, name: str, args: argparse.Namespace) -> _Output:
    from sqe_catalog.integrity import state as integrity_state
    from sqe_catalog.tables import WarehouseTables

    warehouse = _known_warehouse(config, args.warehouse) if args.warehouse else None
    engine = create_engine_for(config.server.database)
    try:
        integrity_state.create_integrity_schema(engine)
        if name == "list-cleanup-tasks":
            return integrity_state.list_tasks(engine, warehouse)
        if name == "list-integrity-events":
            return integrity_state.list_events(engine, warehouse)
        results: dict[str, Any] = {}
        for w in config.warehouses:
            if warehouse in (None, w.name):
                ran = WarehouseTables(w, engine).run_cleanup()
                results[w.name] = {str(task): status for task, status in ran.items()}
        return results
    finally:
        engine.dispose()


# ----------------------------------------------------------------------------------------------------
# Read-restrictions


def _subject(args: argparse.Namespace) -> Subject:
    if args.principal is not None:
        return Subject(SubjectKind.PRINCIPAL, args.principal)
    return Subject(SubjectKind.GROUP, args.group)


def _table_target(config: CatalogServerConfig, args: argparse.Namespace) -> tuple[str, tuple[str, ...], str]:
    warehouse = _known_warehouse(config, args.warehouse)
    namespace = validate_namespace(_namespace(args.namespace))
    return warehouse, namespace, validate_table_name(args.table)


def _read_document(path: str) -> Any:
    try:
        text = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise BadRequestError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    return parse_restrictions_text(text)


def _set_restrictions(
    restrictions: RestrictionStore, engine: Engine, config: CatalogServerConfig, args: argparse.Namespace
) -> _Output:
    warehouse, namespace, table_name = _table_target(config, args)
    document = _read_document(args.file)
    target = (warehouse, namespace, table_name)
    _attach(restrictions, engine, config, target, _subject(args), document, unchecked=args.unchecked)
    return None


def _attach(
    restrictions: RestrictionStore,
    engine: Engine,
    config: CatalogServerConfig,
    target: tuple[str, tuple[str, ...], str],
    subject: Subject,
    document: Any,
    *,
    unchecked: bool,
) -> None:
    warehouse, namespace, table_name = target
    warehouse_config = config.warehouse(warehouse)
    assert warehouse_config is not None
    loaded = WarehouseTables(warehouse_config, engine).load_table(namespace, table_name)
    restrictions.set(warehouse, loaded, subject, document, checked=not unchecked)


def set_restrictions(
    config: CatalogServerConfig,
    warehouse: str,
    namespace: tuple[str, ...],
    table: str,
    subject: Subject,
    document: Any,
) -> None:
    """``set-restrictions`` from Python: attach the read-restrictions ``document`` (a parsed JSON object) to the
    table for ``subject``, validated against the table's current schema, replacing the subject's entry. Opens
    ``server.database`` as the command does, so it works whether or not the server is running."""
    target = (_known_warehouse(config, warehouse), validate_namespace(namespace), validate_table_name(table))
    with _open_restriction_store(config) as (restrictions, engine):
        _attach(restrictions, engine, config, target, subject, document, unchecked=False)


def _clear_restrictions(
    restrictions: RestrictionStore, engine: Engine, config: CatalogServerConfig, args: argparse.Namespace
) -> _Output:
    warehouse, namespace, table_name = _table_target(config, args)
    warehouse_config = config.warehouse(warehouse)
    assert warehouse_config is not None
    try:
        uuid: str | None = str(
            WarehouseTables(warehouse_config, engine).load_table(namespace, table_name).metadata.table_uuid
        )
    except NoSuchTableError:
        uuid = None  # a dropped table's entries can still be cleared by name
    restrictions.clear(warehouse, namespace, table_name, uuid, _subject(args))
    return None


def _list_restrictions(
    restrictions: RestrictionStore, _e: Engine, _c: CatalogServerConfig, args: argparse.Namespace
) -> _Output:
    namespace = validate_namespace(_namespace(args.namespace)) if args.namespace else None
    return [entry.to_json() for entry in restrictions.entries(args.warehouse, namespace)]


_RESTRICTION_COMMANDS: dict[str, _RestrictionCommand] = {
    "set-restrictions": _set_restrictions,
    "clear-restrictions": _clear_restrictions,
    "list-restrictions": _list_restrictions,
}


# ----------------------------------------------------------------------------------------------------
# policies: tags, row-filter and column-mask policies, preview (sqe_catalog.policies)

_POLICY_COMMANDS = (
    "create-policy",
    "update-policy",
    "enable-policy",
    "disable-policy",
    "delete-policy",
    "show-policy",
    "list-policies",
    "attach-policy",
    "detach-policy",
    "set-tag",
    "remove-tag",
    "list-tags",
    "preview-restrictions",
)
_ADMIN_ACTOR = "sqe-catalog admin"


def _policy_parsers(sub: Any) -> None:
    create = sub.add_parser("create-policy", help="create a (disabled) row-filter or column-mask policy")
    _policy_name_args(create)
    create.add_argument("--type", required=True, choices=["system_row_filter", "system_column_mask"])
    create.add_argument("--expression", required=True, help="restricted Rego: 'filter := ...' or 'mask := ...'")
    create.add_argument("--comment", default="")
    update = sub.add_parser("update-policy", help="change a policy's expression or comment (a new revision)")
    _policy_name_args(update)
    update.add_argument("--expression")
    update.add_argument("--comment")
    for name, help_text in (
        ("enable-policy", "enable a policy (preview it first)"),
        ("disable-policy", "disable a policy"),
        ("delete-policy", "delete a policy and its tag associations"),
        ("show-policy", "a policy with its revisions (JSON)"),
    ):
        _policy_name_args(sub.add_parser(name, help=help_text))
    sub.add_parser("list-policies", help="policies (JSON)").add_argument("--warehouse", required=True)
    for name, help_text in (
        ("attach-policy", "select a policy by a tag (ALL_VALUES, or TAG_VALUE with --value)"),
        ("detach-policy", "remove a policy-on-tag selector"),
    ):
        parser = sub.add_parser(name, help=help_text)
        _policy_name_args(parser)
        parser.add_argument("--tag", required=True)
        parser.add_argument("--value", help="TAG_VALUE selector (omit for ALL_VALUES)")
    for name, help_text in (("set-tag", "assign a tag"), ("remove-tag", "remove a tag assignment")):
        parser = sub.add_parser(name, help=f"{help_text} (warehouse, namespace, table or top-level column)")
        parser.add_argument("--warehouse", required=True)
        parser.add_argument("--namespace", help="dotted namespace (omit for the warehouse)")
        parser.add_argument("--table")
        parser.add_argument("--column", help="a top-level column of --table")
        parser.add_argument("--tag", required=True)
        if name == "set-tag":
            parser.add_argument("--value")
    sub.add_parser("list-tags", help="tag assignments (JSON)").add_argument("--warehouse", required=True)
    preview = sub.add_parser(
        "preview-restrictions", help="explain how restrictions resolve for a user and table (enables nothing)"
    )
    preview.add_argument("--warehouse", required=True)
    preview.add_argument("--user", required=True, help="the end user (principal) to resolve for")
    preview.add_argument("--table", required=True, help="dotted namespace and table, e.g. sales.eu.orders")
    preview.add_argument(
        "--enabled-only", action="store_true", help="only enabled policies (default: disabled ones too, as if on)"
    )


def _policy_name_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("--warehouse", required=True)


def _run_policy(config: CatalogServerConfig, name: str, args: argparse.Namespace) -> _Output:
    from sqe_catalog.policies.service import policy_errors

    warehouse_name = _known_warehouse(config, args.warehouse)
    warehouse = config.warehouse(warehouse_name)
    assert warehouse is not None
    with _open_stores(config) as (_auth, engine):
        from sqe_catalog.policies.store import PolicyStore

        store = PolicyStore(engine)
        store.create_schema()
        tables = WarehouseTables(warehouse, engine)
        return policy_errors(lambda: _POLICY_HANDLERS[name](store, engine, tables, config, args))


def _dotted_table(dotted: str) -> tuple[tuple[str, ...], str]:
    parts = tuple(dotted.split("."))
    if len(parts) < 2 or not all(parts):
        raise BadRequestError(f"invalid table {dotted!r}: use namespace.table, e.g. sales.orders")
    return validate_namespace(parts[:-1]), validate_table_name(parts[-1])


def _policy_create(
    store: Any, _e: Engine, _t: WarehouseTables, _c: CatalogServerConfig, a: argparse.Namespace
) -> _Output:
    body = {"name": a.name, "policyType": a.type, "comment": a.comment, "content": {"expression": a.expression}}
    result: dict[str, Any] = store.create_policy(a.warehouse, body, _ADMIN_ACTOR).to_json()
    return result


def _policy_update(
    store: Any, _e: Engine, _t: WarehouseTables, _c: CatalogServerConfig, a: argparse.Namespace
) -> _Output:
    changes: dict[str, Any] = {}
    if a.expression is not None:
        changes["content"] = {"expression": a.expression}
    if a.comment is not None:
        changes["comment"] = a.comment
    if not changes:
        raise BadRequestError("nothing to change: give --expression and/or --comment")
    result: dict[str, Any] = store.update_policy(a.warehouse, a.name, changes, _ADMIN_ACTOR).to_json()
    return result


def _policy_enabled(enabled: bool) -> Callable[..., _Output]:
    def command(store: Any, _e: Engine, _t: WarehouseTables, _c: CatalogServerConfig, a: argparse.Namespace) -> _Output:
        store.update_policy(a.warehouse, a.name, {"enabled": enabled}, _ADMIN_ACTOR)
        return None

    return command


def _policy_show(
    store: Any, _e: Engine, _t: WarehouseTables, _c: CatalogServerConfig, a: argparse.Namespace
) -> _Output:
    result: dict[str, Any] = store.policy(a.warehouse, a.name).to_json()
    result["history"] = store.history(a.warehouse, a.name)
    return result


def _policy_selector(a: argparse.Namespace) -> Any:
    from sqe_catalog.policies.store import Selector

    return Selector(a.tag, a.value)


def _tag_target(tables: WarehouseTables, a: argparse.Namespace) -> Any:
    from sqe_catalog.policies.service import tag_target

    return tag_target(tables, _namespace(a.namespace), a.table, a.column)


def _removal_target(a: argparse.Namespace) -> Any:
    from sqe_catalog.policies.service import removal_target

    return removal_target(_namespace(a.namespace), a.table, a.column)


def _preview(
    store: Any, engine: Engine, tables: WarehouseTables, config: CatalogServerConfig, a: argparse.Namespace
) -> _Output:
    namespace, table_name = _dotted_table(a.table)
    loaded = tables.load_table(namespace, table_name)
    restrictions = RestrictionStore(engine, store)
    report: dict[str, Any] = restrictions.preview(a.warehouse, loaded, a.user, include_disabled=not a.enabled_only)
    report["policies-enabled-on-server"] = config.server.read_restriction_policies
    return report


_POLICY_HANDLERS: dict[str, Callable[..., _Output]] = {
    "create-policy": _policy_create,
    "update-policy": _policy_update,
    "enable-policy": _policy_enabled(True),
    "disable-policy": _policy_enabled(False),
    "delete-policy": lambda s, _e, _t, _c, a: s.delete_policy(a.warehouse, a.name),
    "show-policy": _policy_show,
    "list-policies": lambda s, _e, _t, _c, a: [p.to_json() for p in s.policies(a.warehouse)],
    "attach-policy": lambda s, _e, _t, _c, a: s.attach(a.warehouse, a.name, _policy_selector(a)),
    "detach-policy": lambda s, _e, _t, _c, a: s.detach(a.warehouse, a.name, _policy_selector(a)),
    "set-tag": lambda s, _e, t, _c, a: s.set_tag(a.warehouse, _tag_target(t, a), a.tag, a.value),
    "remove-tag": lambda s, _e, _t, _c, a: s.remove_tag(a.warehouse, _removal_target(a), a.tag),
    "list-tags": lambda s, _e, _t, _c, a: [t.to_json() for t in s.tags(a.warehouse)],
    "preview-restrictions": _preview,
}

# -- end policies ---------------------------------------------------------------------------------------
