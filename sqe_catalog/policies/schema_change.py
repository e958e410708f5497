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
depends on the reader is only which branches hold (``session_user()``, ``is_group_member``), the user's name where
a filter compares a column with it, and which raw entries apply: a mask conflict or a too-deep filter may show for
some readers only. Readers are therefore checked by class (``_reader_key``): readers to whom the same entries apply
and for whom every rule folds alike up to its first branch that holds resolve alike; one of each class is
resolved, one for each name a rule mentions that no principal has yet (a principal created later under it), and
one for a name no one mentions. A class per combination of named groups instead made thousands of classes of a
few thousand principals in a few of fifty groups, each resolved on every schema change.
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

# What a user's name counts as, compared with a column, where it equals no string of a policy or entry.
_ANY_OTHER_NAME = None


@dataclass(frozen=True)
class Mentions:
    """What tells readers apart: the enabled policies' rules, and who has entries."""

    rules: tuple[rego.Rule, ...]
    entry_users: frozenset[str]
    entry_groups: frozenset[str]
    names: frozenset[str]  # every name a principal could be resolved apart under (created later, say)
    strings: frozenset[str]  # every string of the rules and entries: a name equal to one may resolve apart


def mentions_of(
    policies: Iterable[Policy],
    entry_users: Iterable[str],
    entry_groups: Iterable[str],
    entry_documents: Iterable[Any] = (),
) -> Mentions:
    """The rules of ``policies`` (an unparseable one fails for every reader, whatever the schema: left out) and
    the subjects of the entries. Names: the principals with entries, every string ``session_user()`` is compared
    with, and, where a rule compares a column with ``session_user()`` (a user's name is then a value of the
    filter), every string of the rules and entries."""
    rules = tuple(rule for rule in map(_rule_of, policies) if rule is not None)
    strings: set[str] = set()
    for document in entry_documents:
        _strings_of_json(document, strings)
    names, as_value = set(entry_users), False
    for rule in rules:
        for expr in _expressions(rule):
            for compare in _compares(expr):
                found = _strings_of_compare(compare)
                strings.update(found)
                if any(isinstance(side, rego.SessionUser) for side in (compare.left, compare.right)):
                    names.update(found)
                    as_value |= any(isinstance(side, rego.Col) for side in (compare.left, compare.right))
    if as_value:
        names |= strings
    return Mentions(rules, frozenset(entry_users), frozenset(entry_groups), frozenset(names), frozenset(strings))


def _rule_of(policy: Policy) -> rego.Rule | None:
    expression = policy.content.get("expression")
    if not isinstance(expression, str):
        return None
    try:
        return rego.parse(expression, policy.policy_type.rule_kind)
    except PolicyError:
        return None


def _expressions(rule: rego.Rule) -> list[rego.Result]:
    return [*(part for branch in rule.branches for part in branch), rule.fallback]


def _compares(expr: object) -> list[rego.Compare]:
    if isinstance(expr, rego.Compare):
        return [expr]
    if isinstance(expr, rego.Junction):
        return [c for item in expr.items for c in _compares(item)]
    if isinstance(expr, rego.Negation):
        return _compares(expr.child)
    return []


def _strings_of_compare(compare: rego.Compare) -> list[str]:
    sides = (compare.left, compare.right)
    literals = [item for side in sides for item in (side.items if isinstance(side, rego.Array) else (side,))]
    return [item.value for item in literals if isinstance(item, rego.Literal_) and isinstance(item.value, str)]


def _strings_of_json(value: Any, strings: set[str]) -> None:
    if isinstance(value, str):
        strings.add(value)
    elif isinstance(value, list):
        for item in value:
            _strings_of_json(item, strings)
    elif isinstance(value, dict):
        for item in value.values():
            _strings_of_json(item, strings)


def reader_classes(
    memberships: Mapping[str, frozenset[str]], known_groups: frozenset[str], mentions: Mentions
) -> list[Subject]:
    """One subject per class of readers that resolve alike (``_reader_key``): of the principals, of the names
    they could be created under later (of no group until a manager adds one), and of a name no one mentions."""
    representatives: dict[tuple[object, ...], Subject] = {}
    for principal in sorted(memberships):
        groups = memberships[principal]
        representatives.setdefault(_reader_key(mentions, principal, groups), Subject(principal, groups, known_groups))
    unmentioned = ""  # no principal has this name (nor, with the NUL characters, any name)
    while unmentioned in mentions.strings or unmentioned in mentions.names:
        unmentioned += "\0"
    for later in [*sorted(mentions.names - memberships.keys()), unmentioned]:
        no_group: frozenset[str] = frozenset()
        representatives.setdefault(_reader_key(mentions, later, no_group), Subject(later, no_group, known_groups))
    return list(representatives.values())


def _reader_key(mentions: Mentions, user: str, groups: frozenset[str]) -> tuple[object, ...]:
    """What resolution depends on of a reader: which entries apply, and per rule what lowering it folds to for the
    reader. A rule's branches are taken first-match: what follows a branch whose condition holds whatever the row
    is never part of the result, so only the context (group memberships, comparisons of ``session_user()``) of the
    branches up to it counts, and of the fallback when none holds."""
    entries = (user if user in mentions.entry_users else None, groups & mentions.entry_groups)
    context = _Context(user, groups, mentions.strings)
    return (entries, *(_rule_key(rule, context) for rule in mentions.rules))


@dataclass(frozen=True)
class _Context:
    user: str
    groups: frozenset[str]
    strings: frozenset[str]


def _rule_key(rule: rego.Rule, context: _Context) -> tuple[object, ...]:
    atoms: list[object] = []
    for value, condition in rule.branches:
        atoms += [*_atoms(condition, context), *_atoms(value, context)]
        if _holds(condition, context) is True:
            return tuple(atoms)
    return (*atoms, *_atoms(rule.fallback, context))


def _atoms(expr: object, context: _Context) -> list[object]:
    """The reader-dependent values an expression folds, in order: each group membership, each comparison of
    ``session_user()`` with a string (or strings), and the user's name where a column is compared with it (as
    any other name, unless it equals a string of a rule or entry)."""
    if isinstance(expr, rego.GroupMember):
        return [expr.group in context.groups]
    if isinstance(expr, rego.Junction):
        return [atom for item in expr.items for atom in _atoms(item, context)]
    if isinstance(expr, rego.Negation):
        return _atoms(expr.child, context)
    if isinstance(expr, rego.Compare) and _reads_session_user(expr):
        if isinstance(expr.left, rego.Col) or isinstance(expr.right, rego.Col):
            return [context.user if context.user in context.strings else _ANY_OTHER_NAME]
        return [_session_user_holds(expr, context)]
    return []


def _reads_session_user(compare: rego.Compare) -> bool:
    return isinstance(compare.left, rego.SessionUser) or isinstance(compare.right, rego.SessionUser)


def _session_user_holds(compare: rego.Compare, context: _Context) -> bool:
    """``session_user()`` compared with a string (either side) or ``in`` strings, as lowering folds it."""
    other = compare.right if isinstance(compare.left, rego.SessionUser) else compare.left
    values = other.items if isinstance(other, rego.Array) else (other,)
    found = any(isinstance(v, rego.Literal_) and v.value == context.user for v in values)
    return found if compare.op in ("==", "in") else not found


def _holds(expr: object, context: _Context) -> bool | None:
    """A condition's value for the reader whatever the row (Kleene logic), or None where a row decides."""
    if isinstance(expr, rego.Literal_):
        return expr.value if isinstance(expr.value, bool) else None
    if isinstance(expr, rego.GroupMember):
        return expr.group in context.groups
    if isinstance(expr, rego.Negation):
        child = _holds(expr.child, context)
        return None if child is None else not child
    if isinstance(expr, rego.Junction):
        values = [_holds(item, context) for item in expr.items]
        absorbing = expr.op == "or"  # or: true decides; and: false decides
        if absorbing in values:
            return absorbing
        return None if None in values else not absorbing
    if isinstance(expr, rego.Compare) and _reads_session_user(expr):
        if isinstance(expr.left, rego.Col) or isinstance(expr.right, rego.Col):
            return None
        return _session_user_holds(expr, context)
    return None  # a column's comparison


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
