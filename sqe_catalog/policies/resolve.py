"""Resolution: from tags, policies and raw entries to one canonical ``read-restrictions`` object (or an error).

For one end user and one table load (the design's steps 1-8), in this order:

1. effective tags of the table and of each top-level column (``GovernanceSnapshot``);
2. enabled policies whose tag selectors match: row filters by the table's effective tags, masks by each
   column's (which include the table's and its ancestors');
3. parse and type-check each selected policy's expression;
4. bind it to the subject (``session_user()``, groups) and the schema (field ids, literal types); a mask's
   action must apply to the column (type, ``replace-with-null`` on a required field is invalid);
5. canonicalize and sign (``sqe_catalog.policies.lower``); raw per-principal/group entries join here, parsed
   by the engine's own parser and converted to the same canonical form;
6. deduplicate equal signatures, keeping every (policy, tag) or entry as provenance;
7. more than one distinct row-filter signature is a conflict (``resolve-row-filter-conflict``);
8. more than one distinct mask signature for one field is a conflict (``resolve-mask-conflict``).

A constant-true filter is omitted (recorded as such); constant false stays (deny all). The result is validated
with the engine's parser (``sqe.restrictions.parse_restrictions``) as the last check. Any failure raises
``ResolutionError`` with a stable code: the load fails, it never falls back to an unrestricted answer. The same
run produces the explain report (``Resolution.report``) used by the preview endpoint and command.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import NestedField

from sqe import vocabulary
from sqe.errors import RestrictionError
from sqe.restrictions import check_applicable, parse_restrictions
from sqe.restrictions.actions import MASK_TO_FIXED_VALUE, REPLACE_WITH_NULL
from sqe.restrictions.literals import type_name
from sqe.restrictions.schema_index import SchemaIndex
from sqe_catalog.policies import rego
from sqe_catalog.policies.bind import Subject, bind_column
from sqe_catalog.policies.errors import PolicyError
from sqe_catalog.policies.lower import (
    Const,
    canonical,
    from_predicate,
    lower_filter,
    select_mask,
    signature,
    to_wire,
)
from sqe_catalog.policies.store import ColumnTagValue, GovernanceSnapshot, Policy, PolicyType

__all__ = ["RawEntry", "Resolution", "ResolutionError", "resolve"]

_FILTER = "required-row-filter"
_PROJECTIONS = "required-column-projections"
_ColumnTags = dict[str, list[ColumnTagValue]]  # key -> every value that applies to the column


class ResolutionError(PolicyError):
    """Resolution failed: the governed load must fail. ``detail`` names policies/tags (viewers only)."""

    def __init__(self, code: str, message: str, report: dict[str, Any]) -> None:
        super().__init__(code, message)
        self.report = report


@dataclass(frozen=True)
class RawEntry:
    """A checked raw read-restrictions entry that applies to the caller (``subject``: "principal alice")."""

    subject: str
    document: Any


@dataclass
class Resolution:
    wire: dict[str, Any] | None  # None: nothing applies
    signature: str  # "" when nothing applies
    report: dict[str, Any]


@dataclass
class _Candidates:
    filters: dict[str, tuple[Any, list[dict[str, Any]]]] = field(default_factory=dict)  # signature -> wire, prov
    masks: dict[int, dict[str, tuple[str, list[dict[str, Any]]]]] = field(default_factory=dict)

    def add_filter(self, wire: Any, provenance: dict[str, Any]) -> str:
        sig = signature(wire)
        self.filters.setdefault(sig, (wire, []))[1].append(provenance)
        return sig

    def add_mask(self, field_id: int, action: str, provenance: dict[str, Any]) -> str:
        sig = signature({"field-id": field_id, "action": action})
        self.masks.setdefault(field_id, {}).setdefault(sig, (action, []))[1].append(provenance)
        return sig


def resolve(
    *,
    table: str,
    schema: Schema,
    all_schemas: Sequence[Schema],
    namespace: tuple[str, ...],
    table_uuid: str,
    subject: Subject,
    snapshot: GovernanceSnapshot | None,
    entries: Sequence[RawEntry],
    include_disabled: bool = False,
) -> Resolution:
    """Run the pipeline; ResolutionError (with the partial report) on any failure."""
    report: dict[str, Any] = {
        "table": table,
        "user": subject.user,
        "groups": sorted(subject.groups),
        "policies": [],
        "entries": [],
        "conflicts": [],
        "omitted": [],
    }
    candidates = _Candidates()
    try:
        if snapshot is not None:
            columns = _columns_of_every_schema(schema, all_schemas)
            _policy_candidates(
                snapshot,
                namespace,
                table_uuid,
                schema,
                columns,
                subject,
                candidates,
                report,
                include_disabled,
                _former_names(schema, all_schemas),
            )
        for entry in entries:
            _entry_candidates(entry, schema, all_schemas, candidates, report)
        wire = _combine(candidates, schema, report)
        if wire is not None:
            _final_check(wire, schema, all_schemas)
    except ResolutionError as exc:
        report["error"] = {"code": exc.code, "message": exc.message}
        raise
    except PolicyError as exc:
        report["error"] = {"code": exc.code, "message": exc.message}
        raise ResolutionError(exc.code, exc.message, report) from None
    report[vocabulary.READ_RESTRICTIONS] = wire
    report["signature"] = signature(wire) if wire is not None else ""
    report["error"] = None
    return Resolution(wire, report["signature"], report)


# ----------------------------------------------------------------------------------------------------
# Steps 1-4: selection, parsing, binding


def _columns_of_every_schema(schema: Schema, all_schemas: Sequence[Schema]) -> dict[int, NestedField]:
    """Top-level columns by field id: the current schema's, then each dropped one as its newest schema defines
    it. A dropped column's values stay in older snapshots, which time travel reads: its tags and masks stay."""
    columns = {f.field_id: f for f in schema.fields}
    for old in sorted(all_schemas, key=lambda s: s.schema_id, reverse=True):
        for column in old.fields:
            columns.setdefault(column.field_id, column)
    return columns


def _former_names(schema: Schema, all_schemas: Sequence[Schema]) -> dict[int, set[str]]:
    """Every other name each top-level column had in an older schema. A dropped column's older snapshots show it
    under those; and a column renamed since keeps a tag that matched it by name only (the tag of a re-created
    table, whose field ids differ): without them, a rename shed that tag and its mask."""
    current = {f.field_id: f.name for f in schema.fields}
    names: dict[int, set[str]] = {}
    for old in all_schemas:
        for column in old.fields:
            if current.get(column.field_id) != column.name:
                names.setdefault(column.field_id, set()).add(column.name)
    return names


def _shown_names(columns: dict[int, NestedField], schema: Schema) -> dict[int, str]:
    current = {f.field_id for f in schema.fields}
    return {fid: f.name if fid in current else f"{f.name} (dropped, field {fid})" for fid, f in columns.items()}


def _policy_candidates(
    snapshot: GovernanceSnapshot,
    namespace: tuple[str, ...],
    table_uuid: str,
    schema: Schema,
    columns: dict[int, NestedField],
    subject: Subject,
    candidates: _Candidates,
    report: dict[str, Any],
    include_disabled: bool,
    former_names: dict[int, set[str]],
) -> None:
    table_tags = snapshot.table_tags(namespace)
    column_tags = snapshot.column_tags(namespace, list(columns.values()), table_uuid, former_names)
    names = _shown_names(columns, schema)
    report["tags"] = {
        "table": _tags_json(table_tags),
        "columns": {names[fid]: _column_tags_json(tags) for fid, tags in column_tags.items() if tags},
    }
    selection = _Selection(table_tags, column_tags, schema, columns, names, subject, candidates, include_disabled)
    for policy in sorted(snapshot.policies, key=lambda p: p.name):
        entry: dict[str, Any] = {
            "name": policy.name,
            "policyType": policy.policy_type.value,
            "enabled": policy.enabled,
            "revision": policy.revision,
        }
        report["policies"].append(entry)
        try:
            if policy.policy_type is PolicyType.ROW_FILTER:
                _row_filter_policy(policy, selection, entry)
            else:
                _mask_policy(policy, selection, entry)
        except PolicyError as exc:
            entry["error"] = {"code": exc.code, "message": exc.message}  # which policy failed (the schema guard)
            raise


def _tags_json(tags: dict[str, tuple[str | None, str]]) -> dict[str, Any]:
    return {tag: {"value": value, "from": origin} for tag, (value, origin) in sorted(tags.items())}


def _column_tags_json(tags: _ColumnTags) -> dict[str, Any]:
    """As ``_tags_json``; a key with several values (names add theirs) lists each."""
    shown = [(tag, [{"value": v.value, "from": v.origin} for v in values]) for tag, values in tags.items()]
    return {tag: values[0] if len(values) == 1 else values for tag, values in sorted(shown)}


def _column_matching(policy: Policy, tags: _ColumnTags) -> list[dict[str, Any]]:
    """The policy's selectors that any of a column's values of their key matches (each with the first)."""
    matched = []
    for s in policy.selectors:
        for v in tags.get(s.tag, ()):
            if s.matches({s.tag: v.value}):
                former = {"by-former-name": True} if v.by_former_name else {}
                matched.append({**s.to_json(), "effective-value": v.value, "from": v.origin, **former})
                break
    return matched


def _matching(policy: Policy, tags: dict[str, tuple[str | None, str]]) -> list[dict[str, Any]]:
    effective = {tag: value for tag, (value, _origin) in tags.items()}
    return [
        {**s.to_json(), "effective-value": effective[s.tag], "from": tags[s.tag][1]}
        for s in policy.selectors
        if s.matches(effective)
    ]


def _parsed(policy: Policy) -> rego.Rule:
    content = policy.content
    if set(content) != {"expression"}:
        code = "policy-function-unsupported" if "function" in content else "policy-invalid-content"
        raise PolicyError(code, f"policy {policy.name} has no usable expression")
    return _parse(str(content["expression"]), policy.policy_type.rule_kind)


# A rule is immutable, and one expression is resolved again for every load (and, on a schema change, for every
# class of reader): parsing a long one costs more than the rest of its resolution. A failure is not remembered.
_parse = functools.lru_cache(maxsize=256)(rego.parse)


def _selected(policy: Policy, entry: dict[str, Any], include_disabled: bool) -> bool:
    if policy.enabled or include_disabled:
        return True
    entry["status"] = "omitted"
    entry["reason"] = "disabled"
    return False


@dataclass(frozen=True)
class _Selection:
    """What every policy of one table is selected, bound and recorded against."""

    table_tags: dict[str, tuple[str | None, str]]
    column_tags: dict[int, _ColumnTags]
    schema: Schema  # the current one: row filters bind to it
    columns: dict[int, NestedField]  # current and dropped top-level columns: masks select among them
    names: dict[int, str]  # as the report shows them
    subject: Subject
    candidates: _Candidates
    include_disabled: bool


def _row_filter_policy(policy: Policy, selection: _Selection, entry: dict[str, Any]) -> None:
    column_tags, schema, subject = selection.column_tags, selection.schema, selection.subject
    candidates, include_disabled = selection.candidates, selection.include_disabled
    matched = _matching(policy, selection.table_tags)
    entry["matched-tags"] = matched
    if not matched:
        on_columns = any(_column_matching(policy, tags) for tags in column_tags.values())
        entry["status"] = "not-selected"
        entry["reason"] = (
            "selected only by column tags: row filters are selected by the table's effective tags"
            if on_columns
            else "no effective tag of the table matches"
        )
        return
    if not _selected(policy, entry, include_disabled):
        return
    rule = _parsed(policy)
    lowered = lower_filter(rule, subject, lambda name: bind_column(schema, name))
    entry["branches"] = list(lowered.branches)
    entry["chosen-branch"] = _chosen(lowered.branches)
    wire = to_wire(lowered.node)
    if isinstance(lowered.node, Const) and lowered.node.value:
        entry["status"] = "omitted"
        entry["reason"] = "the filter resolves to true for this user"
        return
    provenance = {"policy": policy.name, "tags": [m["tag"] for m in matched]}
    entry["signature"] = candidates.add_filter(wire, provenance)
    entry["status"] = "applied"


def _chosen(branches: tuple[str, ...]) -> int | str | None:
    for i, state in enumerate(branches):
        if state == "true":
            return i
        if state == "row-dependent":
            return "row-dependent"
    return "fallback" if branches else None


def _mask_policy(policy: Policy, selection: _Selection, entry: dict[str, Any]) -> None:
    column_tags, fields, subject = selection.column_tags, selection.columns, selection.subject
    candidates, include_disabled = selection.candidates, selection.include_disabled
    targets = {fid: _column_matching(policy, tags) for fid, tags in column_tags.items()}
    targets = {fid: matched for fid, matched in targets.items() if matched}
    entry["matched-tags"] = {selection.names[fid]: matched for fid, matched in sorted(targets.items())}
    if not targets:
        entry["status"] = "not-selected"
        entry["reason"] = "no effective tag of any column matches"
        return
    if not _selected(policy, entry, include_disabled):
        return
    rule = _parsed(policy)
    action, chosen = select_mask(rule, subject)
    entry["chosen-branch"] = "fallback" if chosen is None else chosen
    entry["action"] = action
    entry["signatures"] = {}
    # Every action the rule can produce, fallback included, must apply to every selected column: whether a
    # column can be masked never depends on who asks. A column selected only by names it no longer has is masked
    # as a dropped one (a stand-in where the action does not fit): renaming a column through a tagged name and
    # back must not make the table unreadable for good, which no policy manager could undo but by lifting the tag.
    actions = [value.name for value, _ in rule.branches if isinstance(value, rego.Action)]
    actions.append(rule.fallback.name if isinstance(rule.fallback, rego.Action) else action)
    current = {f.field_id for f in selection.schema.fields}
    for fid, matched in sorted(targets.items()):
        column = fields[fid]
        applied = action
        if fid in current and not all(m.get("by-former-name") for m in matched):
            for candidate in dict.fromkeys(actions):
                try:
                    check_applicable(candidate, column)
                except RestrictionError:
                    entry["not-applicable"] = _not_applicable(column, candidate, matched)
                    raise PolicyError(
                        "bind-action-not-applicable",
                        f"mask {candidate} of policy {policy.name} does not apply to column {column.name!r}",
                    ) from None
        else:
            applied = _dropped_column_action(action, column, selection.names[fid], policy.name)
            if applied != action:
                entry.setdefault("stand-ins", {})[selection.names[fid]] = applied
        provenance = {"policy": policy.name, "tags": [m["tag"] for m in matched]}
        entry["signatures"][selection.names[fid]] = candidates.add_mask(fid, applied, provenance)
    entry["status"] = "applied"


def _not_applicable(column: NestedField, action: str, matched: list[dict[str, Any]]) -> dict[str, Any]:
    """What a mask that does not fit its column is recorded as: the column, its type, the action, the tags."""
    return {
        "column": column.name,
        "type": type_name(column.field_type),
        "action": action,
        "tags": [{"tag": m["tag"], "value": m["effective-value"]} for m in matched],
    }


def _dropped_column_action(action: str, column: NestedField, shown: str, policy: str) -> str:
    """The mask of a dropped column (or one selected only by a former name): the policy's own where it applies to
    the column's type, else replace-with-null (or a fixed value for a required column), so an old column or name
    never makes the table unreadable."""
    for candidate in (action, REPLACE_WITH_NULL, MASK_TO_FIXED_VALUE):
        try:
            check_applicable(candidate, column)
            return candidate
        except RestrictionError:
            continue
    raise PolicyError("bind-action-not-applicable", f"no mask of policy {policy} applies to column {shown!r}")


def _entry_candidates(
    entry: RawEntry, schema: Schema, all_schemas: Sequence[Schema], candidates: _Candidates, report: dict[str, Any]
) -> None:
    try:
        plan = parse_restrictions(entry.document, schema, all_schemas=all_schemas)
    except RestrictionError:
        raise PolicyError("entry-no-longer-fits", f"the entry of {entry.subject} no longer fits the table") from None
    record: dict[str, Any] = {"subject": entry.subject}
    report["entries"].append(record)
    provenance = {"entry": entry.subject}
    if plan.always_false:
        record["row-filter-signature"] = candidates.add_filter(False, provenance)
    elif plan.row_filter is not None:
        index = SchemaIndex(schema)

        def nullable(field_id: int) -> bool:
            # A struct child is null wherever an enclosing struct is, however ``required`` it is itself: folding
            # not-null on it to true would serve rows the entry hides.
            info = index.get(field_id)
            steps = [index.get(step) for step in info.path] if info is not None else [None]
            return any(step is None or not step.field.required for step in steps)

        folded = canonical(from_predicate(plan.row_filter, nullable))
        if not (isinstance(folded, Const) and folded.value):
            record["row-filter-signature"] = candidates.add_filter(to_wire(folded), provenance)
    for mask in plan.column_masks:
        candidates.add_mask(mask.field_id, mask.action, provenance)
    record["masked-field-ids"] = [m.field_id for m in plan.column_masks]


# ----------------------------------------------------------------------------------------------------
# Steps 6-8: deduplication and conflicts


def _combine(candidates: _Candidates, schema: Schema, report: dict[str, Any]) -> dict[str, Any] | None:
    wire: dict[str, Any] = {}
    if len(candidates.filters) > 1:
        report["conflicts"].append(
            {
                "kind": "row-filter",
                "candidates": [{"signature": s, "provenance": p} for s, (_w, p) in sorted(candidates.filters.items())],
            }
        )
        raise ResolutionError(
            "resolve-row-filter-conflict",
            "distinct row filters apply to this user and table: "
            + "; ".join(_provenance_text(p) for _s, (_w, p) in sorted(candidates.filters.items())),
            report,
        )
    if candidates.filters:
        ((sig, (filter_wire, provenance)),) = candidates.filters.items()
        report["row-filter"] = {"signature": sig, "provenance": provenance}
        wire[_FILTER] = filter_wire
    names = {f.field_id: f.name for f in schema.fields}
    projections = []
    report["masks"] = []
    for field_id in sorted(candidates.masks):
        options = candidates.masks[field_id]
        if len(options) > 1:
            report["conflicts"].append(
                {
                    "kind": "column-mask",
                    "field-id": field_id,
                    "candidates": [
                        {"signature": s, "action": a, "provenance": p} for s, (a, p) in sorted(options.items())
                    ],
                }
            )
            raise ResolutionError(
                "resolve-mask-conflict",
                f"distinct masks apply to column {names.get(field_id, field_id)!r}: "
                + "; ".join(f"{a} from {_provenance_text(p)}" for _s, (a, p) in sorted(options.items())),
                report,
            )
        ((sig, (action, provenance)),) = options.items()
        projections.append({"field-id": field_id, "action": action})
        report["masks"].append(
            {
                "field-id": field_id,
                "column": names.get(field_id),
                "action": action,
                "signature": sig,
                "provenance": provenance,
            }
        )
    if projections:
        wire[_PROJECTIONS] = projections
    return wire or None


def _provenance_text(provenance: list[dict[str, Any]]) -> str:
    parts = []
    for p in provenance:
        if "policy" in p:
            parts.append(f"policy {p['policy']} (tags {', '.join(p['tags'])})")
        else:
            parts.append(f"entry of {p['entry']}")
    return " and ".join(parts)


def _final_check(wire: dict[str, Any], schema: Schema, all_schemas: Sequence[Schema]) -> None:
    try:
        parse_restrictions(wire, schema, all_schemas=all_schemas)
    except RestrictionError as exc:
        raise PolicyError("resolve-invalid-restrictions", f"the resolved restrictions do not validate: {exc}") from None
