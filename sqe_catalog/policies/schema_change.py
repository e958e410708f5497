"""The schema guard: which readers a schema change must be checked for, and why a change is refused.

A schema change (a commit's ``add-schema``/``set-current-schema``, a create transaction, a register) decides what
a table's policies bind to: the columns a row filter reads, the names (and so the tags) and types of the columns
a mask selects. Anyone allowed to change the schema could otherwise make every governed load of the table fail
(a long column renamed onto a name tagged with a string-only mask, a row filter's column dropped or retyped): a
denial of service by a writer, silent until someone reads. So such a change, by a principal without
``CATALOG_MANAGE_POLICIES``, is refused before anything is written when the table's restrictions would not
resolve for a reader for whom they resolve now.

Which readers: resolution binds every branch of every selected policy eagerly, whoever asks (columns, literal
types, whether each of a mask's actions fits its column), so those failures are the same for every reader. What
depends on the reader is only which branches hold (``session_user()``, ``is_group_member``) and which raw entries
apply: a mask conflict or a too-deep filter may show for some readers only. Readers are therefore checked by
class: principals whose names no policy or entry mentions (``mentions_of``), and whose groups agree on the groups
policies and entries name, resolve alike; one of each class is resolved, one for each mentioned name no principal
has yet (a principal created later under it resolves as that name does), and one more that stands for a
principal of no group and no mention.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqe_catalog.policies import rego
from sqe_catalog.policies.bind import Subject
from sqe_catalog.policies.errors import PolicyError
from sqe_catalog.policies.store import Policy

__all__ = ["Mentions", "explain_refusal", "mentions_of", "reader_classes"]

# Stands for every principal of no group that no policy or entry names: a name no principal can have.
_ANYONE = ""


@dataclass(frozen=True)
class Mentions:
    """The user names and groups whose presence can change what a table's restrictions resolve to."""

    users: frozenset[str]
    groups: frozenset[str]


def mentions_of(policies: Iterable[Policy], entry_users: Iterable[str], entry_groups: Iterable[str]) -> Mentions:
    """The user names and groups that can tell readers apart: the principals and groups that have entries, every
    group a policy's expression names and every string ``session_user()`` is compared with; and, where a policy
    compares a column with ``session_user()`` (so a user's name becomes a value of the filter), every string any
    policy holds: a name equal to another filter's literal may resolve unlike the others."""
    found = _Found(set(entry_users), set(entry_groups), set(), user_as_value=False)
    for policy in policies:
        rule = _rule_of(policy)
        if rule is None:
            continue  # unparseable: it fails for every reader, whatever the schema
        for value, condition in rule.branches:
            _collect(value, found)
            _collect(condition, found)
        _collect(rule.fallback, found)
    users = found.users | found.strings if found.user_as_value else found.users
    return Mentions(frozenset(users), frozenset(found.groups))


@dataclass
class _Found:
    users: set[str]  # compared with session_user(), or with entries
    groups: set[str]
    strings: set[str]  # every string literal
    user_as_value: bool  # session_user() compared with a column


def _rule_of(policy: Policy) -> rego.Rule | None:
    expression = policy.content.get("expression")
    if not isinstance(expression, str):
        return None
    try:
        return rego.parse(expression, policy.policy_type.rule_kind)
    except PolicyError:
        return None


def _collect(expr: object, found: _Found) -> None:
    if isinstance(expr, rego.GroupMember):
        found.groups.add(expr.group)
    elif isinstance(expr, rego.Junction):
        for item in expr.items:
            _collect(item, found)
    elif isinstance(expr, rego.Negation):
        _collect(expr.child, found)
    elif isinstance(expr, rego.Compare):
        sides = (expr.left, expr.right)
        literals = [item for side in sides for item in (side.items if isinstance(side, rego.Array) else (side,))]
        strings = [item.value for item in literals if isinstance(item, rego.Literal_) and isinstance(item.value, str)]
        found.strings.update(strings)
        if any(isinstance(side, rego.SessionUser) for side in sides):
            found.users.update(strings)
            found.user_as_value |= any(isinstance(side, rego.Col) for side in sides)


def reader_classes(
    memberships: Mapping[str, frozenset[str]], known_groups: frozenset[str], mentions: Mentions
) -> list[Subject]:
    """One subject per class of principals that resolve alike (module docstring), one per mentioned name no
    principal has yet, and one for anyone else."""
    representatives: dict[tuple[str, frozenset[str]], Subject] = {}
    for principal in sorted(memberships):
        groups = memberships[principal]
        key = (principal if principal in mentions.users else _ANYONE, groups & mentions.groups)
        representatives.setdefault(key, Subject(principal, groups, known_groups))
    for later in sorted(mentions.users - memberships.keys()):  # of no group until a manager adds one
        representatives.setdefault((later, frozenset()), Subject(later, frozenset(), known_groups))
    representatives.setdefault((_ANYONE, frozenset()), Subject(_ANYONE, frozenset(), known_groups))
    return list(representatives.values())


# ----------------------------------------------------------------------------------------------------
# The refusal's message: the column and what would fail; the tags and masks only in the catalog log


def explain_refusal(
    code: str, message: str, report: dict[str, Any], column_names: Mapping[int, str], *, governance: bool = False
) -> str:
    """Why resolution would fail, in terms of what the writer changed (columns). With ``governance`` (for the
    catalog log) also the tags and masks involved: a writer need not manage policies, and tag names and values and
    mask actions are shown only to those who do, as a failed load's detail is. Policy names, groups and literal
    values never appear."""
    for entry in report.get("policies", ()):
        if "not-applicable" in entry:
            return _not_applicable_text(entry["not-applicable"], governance)
        if "error" in entry:
            return _policy_error_text(entry, code, message, governance)
    if report.get("conflicts"):
        return _conflict_text(report["conflicts"][-1], column_names, governance)
    if code == "entry-no-longer-fits":
        return "a read-restrictions entry of the table would no longer fit its schema"
    return "the table's read-restrictions would no longer resolve"


def _not_applicable_text(culprit: dict[str, Any], governance: bool) -> str:
    if not governance:
        return f"column {culprit['column']!r} ({culprit['type']}) would be masked with a mask its type cannot take"
    return (
        f"column {culprit['column']!r} ({culprit['type']}) would be masked with {culprit['action']}, selected by "
        f"its {_tags_text(culprit['tags'])}, and that mask does not apply to it"
    )


def _policy_error_text(entry: dict[str, Any], code: str, message: str, governance: bool) -> str:
    if code.startswith("bind-") and code not in ("bind-unknown-group", "bind-action-not-applicable"):
        detail = message  # a binding message names the column and its type, never a literal value
    else:
        detail = f"it would fail with [{code}]"
    matched = entry.get("matched-tags")
    if entry.get("policyType") == "system_row_filter" and isinstance(matched, list):
        if not governance:
            return f"the table's row filter would no longer apply: {detail}"
        tags = [{"tag": m["tag"], "value": m["effective-value"]} for m in matched]
        return f"the row filter selected by the table's {_tags_text(tags)} would no longer apply: {detail}"
    return f"a column mask would no longer apply: {detail}"


def _conflict_text(conflict: dict[str, Any], column_names: Mapping[int, str], governance: bool) -> str:
    if conflict.get("kind") == "column-mask":
        column = column_names.get(conflict["field-id"], f"field {conflict['field-id']}")
        text = f"column {column!r} would get different masks for some readers"
        if not governance:
            return text
        options = [f"{c['action']} ({_provenance_text(c['provenance'])})" for c in conflict["candidates"]]
        return f"{text}: {', '.join(options)}"
    return "different row filters would apply to some readers"


def _provenance_text(provenance: list[dict[str, Any]]) -> str:
    parts = []
    for p in provenance:
        parts.append(f"tag {', '.join(p['tags'])}" if "policy" in p else "a read-restrictions entry")
    return " and ".join(dict.fromkeys(parts))


def _tags_text(tags: list[dict[str, Any]]) -> str:
    shown = [t["tag"] if t["value"] is None else f"{t['tag']}={t['value']}" for t in tags]
    return ("tag " if len(shown) == 1 else "tags ") + ", ".join(dict.fromkeys(shown))
