"""A validated read-restrictions plan: parse it from loadTable, apply it to Arrow batches, ship it to
workers.

Order of application (REST spec, ReadRestrictions): the row filter on raw values first, then the masks on
the surviving rows; the user's query runs afterwards on the masked values. A filter may read columns the
query does not output (``required_columns`` adds them to the scan; ``apply`` drops them after filtering).
Masks apply only to columns that are output.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, BooleanExpression
from pyiceberg.schema import Schema

from sqe.errors import InvalidRestrictionError, UnsupportedRestrictionError
from sqe.restrictions.actions import (
    ACTIONS,
    REPLACE_WITH_NULL,
    SHA_256_QUERY_LOCAL,
    apply_action,
    check_applicable,
    check_salt,
)
from sqe.restrictions.columns import BatchColumns
from sqe.restrictions.evaluate import evaluate
from sqe.restrictions.expressions import (
    Predicate,
    parse_row_filter,
    predicate_from_json,
    predicate_to_json,
    referenced_fields,
)
from sqe.restrictions.pushdown import to_pyiceberg
from sqe.restrictions.schema_index import FieldInfo, SchemaIndex
from sqe.vocabulary import READ_RESTRICTIONS

SALT_BYTES = 16
PLAN_FORMAT = "sqe-restriction-plan"
PLAN_VERSION = 1
_TOP_KEYS = frozenset({"required-column-projections", "required-row-filter"})
_ERR = READ_RESTRICTIONS  # errors name the wire object they are about


@dataclass(frozen=True)
class ColumnMask:
    field_id: int
    action: str
    name: str  # column name in the schema the plan was validated against (for EXPLAIN)
    type_name: str


@dataclass(frozen=True)
class RestrictionPlan:
    row_filter: Predicate | None = None  # None: no filter (absent or always true)
    always_false: bool = False  # the filter is false: no row is visible
    column_masks: tuple[ColumnMask, ...] = ()
    _masks: Mapping[int, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.always_false and self.row_filter is not None:
            raise ValueError("an always-false plan has no row filter")
        object.__setattr__(self, "_masks", MappingProxyType({m.field_id: m.action for m in self.column_masks}))

    @property
    def masks(self) -> Mapping[int, str]:
        """Field id -> action."""
        return self._masks

    @property
    def masked_field_ids(self) -> frozenset[int]:
        return frozenset(self._masks)

    @property
    def filter_field_ids(self) -> frozenset[int]:
        """Top-level field ids the row filter reads."""
        return frozenset(ref.top_level_id for ref in referenced_fields(self.row_filter))

    @property
    def is_restricted(self) -> bool:
        return self.always_false or self.row_filter is not None or bool(self.column_masks)

    def describe(self) -> dict[str, Any]:
        """For EXPLAIN: masked columns with their actions, and whether a row filter applies (no values)."""
        return {
            "row_filter": self.always_false or self.row_filter is not None,
            "always_false": self.always_false,
            "masked_columns": [
                {"column": mask.name, "field_id": mask.field_id, "action": mask.action} for mask in self.column_masks
            ],
        }

    def safe_pushdown_filter(self, schema: Schema | None = None) -> BooleanExpression:
        """The required filter for pyiceberg scan planning, never stronger than the exact filter.

        Pass the scan's schema to check each leaf binds to the same field id there.
        """
        if self.always_false:
            return AlwaysFalse()
        if self.row_filter is None:
            return AlwaysTrue()
        return to_pyiceberg(self.row_filter, schema)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "always-false": self.always_false,
            "row-filter": None if self.row_filter is None else predicate_to_json(self.row_filter),
            "masks": [
                {"field-id": m.field_id, "action": m.action, "name": m.name, "field-type": m.type_name}
                for m in self.column_masks
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> RestrictionPlan:
        """Read a plan written by ``to_json`` (a dict or its JSON text); anything else fails closed."""
        document = _strict_loads(data) if isinstance(data, str | bytes) else data
        expected = {"format", "version", "always-false", "row-filter", "masks"}
        if not isinstance(document, dict) or set(document) != expected:
            raise InvalidRestrictionError("restriction plan: malformed document")
        if document["format"] != PLAN_FORMAT or document["version"] != PLAN_VERSION:
            raise InvalidRestrictionError("restriction plan: unknown format or version")
        always_false = document["always-false"]
        if not isinstance(always_false, bool) or not isinstance(document["masks"], list):
            raise InvalidRestrictionError("restriction plan: malformed document")
        try:
            row_filter = None if document["row-filter"] is None else predicate_from_json(document["row-filter"])
        except RecursionError:
            raise InvalidRestrictionError("restriction plan: row filter is nested too deeply") from None
        if always_false and row_filter is not None:
            raise InvalidRestrictionError("restriction plan: an always-false plan has no row filter")
        masks = tuple(_mask_from_json(item) for item in document["masks"])
        if len({mask.field_id for mask in masks}) != len(masks):
            raise InvalidRestrictionError("restriction plan: duplicate masked field id")
        return cls(row_filter=row_filter, always_false=always_false, column_masks=masks)


EMPTY_PLAN = RestrictionPlan()


# ------------------------------------------------------------------------------------------ parsing


def parse_restrictions(raw: Any, schema: Schema, *, all_schemas: Sequence[Schema] = ()) -> RestrictionPlan:
    """Validate the ``read-restrictions`` value of a loadTable response against the table schema.

    ``raw`` is the decoded JSON value (or its text). Filter references resolve against the current ``schema``;
    projection field ids against it and ``all_schemas`` (a dropped column may keep a projection). Any problem
    raises a RestrictionError subclass naming it.
    """
    document = _strict_loads(raw) if isinstance(raw, str | bytes) else raw
    if document is None:
        return EMPTY_PLAN
    if not isinstance(document, dict):
        raise InvalidRestrictionError(f"{_ERR}: expected a JSON object")
    unexpected = set(document) - _TOP_KEYS
    if unexpected:
        raise InvalidRestrictionError(f"{_ERR}: unexpected keys {sorted(unexpected)}")
    current = SchemaIndex(schema)
    history = [SchemaIndex(old) for old in all_schemas]
    masks = _parse_projections(document.get("required-column-projections"), current, history)
    try:
        tree = parse_row_filter(document.get("required-row-filter"), current)
    except RecursionError:
        raise InvalidRestrictionError(f"{_ERR}: required-row-filter is nested too deeply") from None
    if isinstance(tree, bool):
        return RestrictionPlan(always_false=not tree, column_masks=masks)
    return RestrictionPlan(row_filter=tree, column_masks=masks)


def strict_json_loads(text: str | bytes) -> Any:
    """json.loads that rejects duplicate keys and NaN/Infinity, for loadTable bodies with restrictions."""
    return _strict_loads(text)


def _strict_loads(text: str | bytes) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError: ValueError
        raise InvalidRestrictionError(f"{_ERR}: malformed JSON ({type(exc).__name__})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate object key")
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_projections(raw: Any, current: SchemaIndex, history: list[SchemaIndex]) -> tuple[ColumnMask, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRestrictionError(f"{_ERR}: required-column-projections must be a list")
    entries = [_projection_entry(item) for item in raw]
    ids = [field_id for field_id, _ in entries]
    duplicates = sorted({field_id for field_id in ids if ids.count(field_id) > 1})
    if duplicates:
        raise InvalidRestrictionError(f"{_ERR}: duplicate column projections for field id {duplicates[0]}")
    infos = {field_id: _resolve_target(field_id, current, history) for field_id in ids}
    _check_targets(infos)
    masks = []
    for field_id, action in entries:
        info = infos[field_id]
        check_applicable(action, info.field)
        masks.append(ColumnMask(field_id, action, info.name, info.type_name))
    return tuple(masks)


def _projection_entry(item: Any) -> tuple[int, str]:
    if not isinstance(item, dict) or set(item) != {"field-id", "action"}:
        raise InvalidRestrictionError(f"{_ERR}: a column projection must have exactly 'field-id' and 'action'")
    field_id, action = item["field-id"], item["action"]
    if isinstance(field_id, bool) or not isinstance(field_id, int):
        raise InvalidRestrictionError(f"{_ERR}: a column projection's field-id must be an integer")
    if field_id <= 0:
        raise InvalidRestrictionError(f"{_ERR}: column projection field-id {field_id} must be positive")
    if not isinstance(action, str):
        raise InvalidRestrictionError(f"{_ERR}: the action for field id {field_id} must be a string")
    if action not in ACTIONS:
        raise UnsupportedRestrictionError(f"{_ERR}: unknown action '{action}' for field id {field_id}")
    return field_id, action


def _resolve_target(field_id: int, current: SchemaIndex, history: list[SchemaIndex]) -> FieldInfo:
    """The field in the current schema, else in the newest older schema that has it (a dropped column)."""
    info = current.get(field_id)
    for index in reversed(history):
        if info is not None:
            break
        info = index.get(field_id)
    if info is None:
        raise InvalidRestrictionError(f"{_ERR}: column projection field id {field_id} is not in the table schema")
    return info


def _check_targets(infos: Mapping[int, FieldInfo]) -> None:
    for field_id, info in infos.items():
        if info.in_map_key:
            raise InvalidRestrictionError(f"{_ERR}: column projection field id {field_id} targets a map key")
    for field_id, info in infos.items():
        for ancestor in info.ancestors:
            if ancestor in infos:
                raise InvalidRestrictionError(
                    f"{_ERR}: column projections on field id {field_id} and on its ancestor {ancestor}"
                )
    for field_id, info in infos.items():
        if not info.top_level:
            raise UnsupportedRestrictionError(
                f"{_ERR}: column projection on nested field id {field_id} is not supported (top-level only)"
            )


def _mask_from_json(item: Any) -> ColumnMask:
    if not isinstance(item, dict) or set(item) != {"field-id", "action", "name", "field-type"}:
        raise InvalidRestrictionError("restriction plan: malformed mask")
    field_id, action, name, type_name = item["field-id"], item["action"], item["name"], item["field-type"]
    if isinstance(field_id, bool) or not isinstance(field_id, int) or field_id <= 0:
        raise InvalidRestrictionError("restriction plan: malformed mask field id")
    if action not in ACTIONS or not isinstance(name, str) or not isinstance(type_name, str):
        raise InvalidRestrictionError("restriction plan: malformed mask")
    return ColumnMask(field_id, action, name, type_name)


# ----------------------------------------------------------------------------------------- applying


def required_columns(plan: RestrictionPlan, projected_field_ids: Collection[int]) -> set[int]:
    """Top-level field ids the scan must read: the projection plus every column the row filter reads."""
    return set(projected_field_ids) | plan.filter_field_ids


def new_query_salt() -> bytes:
    """A fresh random salt for sha-256-query-local, shared by every column of one query."""
    return secrets.token_bytes(SALT_BYTES)


def apply(
    batch: pa.RecordBatch,
    plan: RestrictionPlan,
    *,
    salt: bytes,
    schema: Schema,
    output_field_ids: Collection[int] | None = None,
) -> pa.RecordBatch:
    """Row filter on raw values, then drop filter-only columns, then mask the output columns.

    ``schema`` is the Iceberg schema the batch was read with (columns match by field-id metadata, else by
    name). ``output_field_ids`` are the top-level columns to return (all when None).
    """
    if not plan.is_restricted and output_field_ids is None:
        return batch
    columns = BatchColumns(batch, schema)
    if SHA_256_QUERY_LOCAL in plan.masks.values():
        check_salt(salt)
    if plan.always_false:
        batch = batch.slice(0, 0)
    elif plan.row_filter is not None:
        keep = evaluate(plan.row_filter, columns)
        if keep.true_count != batch.num_rows:
            batch = batch.filter(keep)
    fields: list[pa.Field] = []
    arrays: list[pa.Array] = []
    for position, field_id in enumerate(columns.field_ids):
        if output_field_ids is not None and field_id not in output_field_ids:
            continue
        arrow_field, array = batch.schema.field(position), batch.column(position)
        action = plan.masks.get(field_id)
        if action is not None and batch.num_rows:
            array = apply_action(action, array, salt=salt)
        if action == REPLACE_WITH_NULL:
            arrow_field = arrow_field.with_nullable(True)
        fields.append(arrow_field)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=batch.schema.metadata))
