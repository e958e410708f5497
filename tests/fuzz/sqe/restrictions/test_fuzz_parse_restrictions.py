"""Fuzz parse_restrictions: any JSON (or text, or bytes) gives a RestrictionPlan or a RestrictionError.

A valid plan also survives the worker wire form: ``to_json`` -> ``from_json`` gives the same plan and the
re-serialization is a fixed point (canonical).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sqe.errors import RestrictionError
from sqe.restrictions import ACTIONS, RestrictionPlan, parse_restrictions
from tests.fuzz.checks import assert_one_line
from tests.fuzz.strategies import json_scalars, json_values
from tests.unit.sqe.restrictions.restriction_fixtures import ALL_TYPES

_FIELD_IDS = st.integers(min_value=-2, max_value=32)
_KINDS = [
    "true",
    "false",
    "and",
    "or",
    "not",
    "is-null",
    "not-null",
    "is-nan",
    "not-nan",
    "lt",
    "lt-eq",
    "gt",
    "gt-eq",
    "eq",
    "not-eq",
    "starts-with",
    "not-starts-with",
    "in",
    "not-in",
    "apply",
    "reference",
    "literal",
    "literals",
    "transform",
    "bogus",
]
_KEYS = st.sampled_from(["type", "left", "right", "child", "term", "value", "values", "id", "name", "data-type"])
_TYPE_NAMES = st.sampled_from(["int", "long", "string", "date", "decimal(9,2)", "boolean", "uuid", "fixed[3]", "x"])


def _reference() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda i: {"type": "reference", "id": i}, _FIELD_IDS),
        st.builds(lambda n: {"type": "reference", "name": n}, st.sampled_from(["s", "i", "addr.city", "nope", ""])),
    )


def _literal() -> st.SearchStrategy[Any]:
    typed = st.builds(lambda v, t: {"type": "literal", "value": v, "data-type": t}, json_scalars, _TYPE_NAMES)
    return st.one_of(json_scalars, st.builds(lambda v: {"type": "literal", "value": v}, json_scalars), typed)


def _predicates() -> st.SearchStrategy[Any]:
    """Structurally plausible predicates (so the fuzzer reaches the binder and literal decoder)."""
    leaf = st.one_of(
        st.booleans(),
        st.builds(lambda k, ref: {"type": k, "child": ref}, st.sampled_from(_KINDS), _reference()),
        st.builds(
            lambda k, ref, lit: {"type": k, "left": ref, "right": lit},
            st.sampled_from(_KINDS),
            _reference(),
            _literal(),
        ),
        st.builds(
            lambda k, lit, ref: {"type": k, "left": lit, "right": ref},
            st.sampled_from(_KINDS),
            _literal(),
            _reference(),
        ),
        st.builds(
            lambda k, ref, vs: {"type": k, "child": ref, "values": vs},
            st.sampled_from(["in", "not-in"]),
            _reference(),
            st.lists(_literal(), max_size=4),
        ),
        st.builds(
            lambda k, t, v: {"type": k, "term": t, "value": v},
            st.sampled_from(_KINDS),
            st.sampled_from(["s", "i", "d", "x"]),
            json_scalars,
        ),
    )
    return st.recursive(
        leaf,
        lambda children: st.one_of(
            st.builds(
                lambda k, a, b: {"type": k, "left": a, "right": b}, st.sampled_from(["and", "or"]), children, children
            ),
            st.builds(lambda c: {"type": "not", "child": c}, children),
        ),
        max_leaves=8,
    )


def _projections() -> st.SearchStrategy[Any]:
    entry = st.builds(lambda i, a: {"field-id": i, "action": a}, _FIELD_IDS, st.sampled_from([*ACTIONS, "drop", ""]))
    return st.one_of(st.lists(entry, max_size=4), json_values())


def _documents() -> st.SearchStrategy[Any]:
    structured = st.fixed_dictionaries(
        {}, optional={"required-row-filter": _predicates(), "required-column-projections": _projections()}
    )
    return st.one_of(structured, json_values(keys=_KEYS), st.dictionaries(_KEYS, json_values(keys=_KEYS)))


def _parse_or_typed_error(raw: Any) -> RestrictionPlan | None:
    try:
        return parse_restrictions(raw, ALL_TYPES, all_schemas=[ALL_TYPES])
    except RestrictionError as exc:
        assert_one_line(str(exc))
        return None


def _check_canonical(plan: RestrictionPlan) -> None:
    wire = plan.to_json()
    again = RestrictionPlan.from_json(json.dumps(wire))
    assert again == plan
    assert again.to_json() == wire


@given(_documents())
def test_any_document_parses_or_fails_typed(document: Any) -> None:
    plan = _parse_or_typed_error(document)
    if plan is not None:
        _check_canonical(plan)


@given(_documents())
def test_text_form_gives_the_same_answer_as_the_decoded_form(document: Any) -> None:
    decoded = _parse_or_typed_error(document)
    from_text = _parse_or_typed_error(json.dumps(document))
    assert decoded == from_text


@given(st.one_of(st.binary(max_size=200), st.text(max_size=200)))
def test_arbitrary_text_and_bytes_fail_typed(raw: str | bytes) -> None:
    plan = _parse_or_typed_error(raw)
    if plan is not None:
        _check_canonical(plan)


@given(json_values(max_leaves=20))
def test_arbitrary_plan_wire_forms_fail_typed(document: Any) -> None:
    try:
        plan = RestrictionPlan.from_json(document)
    except RestrictionError:
        return
    _check_canonical(plan)
