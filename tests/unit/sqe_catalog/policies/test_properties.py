"""Property tests (hypothesis) of the restricted Rego parser and the canonical form.

- no input makes the parser raise anything but ``RegoError`` (text soup and token soup);
- canonicalization is deterministic (independent of child order) and idempotent, also across the wire
  (canonical -> read-restrictions JSON -> the engine's parser -> canonical again);
- the lowered ``if``/``else`` chain equals evaluating the chain (first true branch) under the design's null
  semantics, evaluated here with Iceberg's two-valued semantics, for every row of a small exhaustive grid.
"""

from __future__ import annotations

import itertools
import random
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, NestedField, StringType

from sqe.restrictions import parse_restrictions
from sqe_catalog.policies import rego
from sqe_catalog.policies.bind import Subject, bind_column
from sqe_catalog.policies.errors import PolicyError, RegoError
from sqe_catalog.policies.lower import (
    Const,
    Junction,
    Leaf,
    Node,
    canonical,
    from_predicate,
    lower_filter,
    negate,
    to_wire,
)

FAST = settings(max_examples=150, deadline=timedelta(milliseconds=800), suppress_health_check=[HealthCheck.too_slow])
SCHEMA = Schema(
    NestedField(1, "n", IntegerType(), required=False),
    NestedField(2, "r", IntegerType(), required=True),
    NestedField(3, "s", StringType(), required=False),
)
NULLABLE = {1: True, 2: False, 3: True}
TYPES = {1: "int", 2: "int", 3: "string"}
KNOWN_GROUPS = frozenset({"g1", "g2"})
ROWS = [
    {1: n, 2: r, 3: s} for n, r, s in itertools.product([None, -2, -1, 0, 1, 2], [-1, 0, 1], [None, "a", "b", "alice"])
]


# ----------------------------------------------------------------------------------------------------
# No untyped exception on any input

TOKENS = [
    "filter", "mask", ":=", "if", "else", "and", "or", "not", "in", "true", "false", "null", "col", "session_user",
    "is_group_member", "action", "(", ")", "[", "]", ",", "==", "!=", "<", "<=", ">", ">=", '"a"', '"show-last-4"',
    '"\\u00e9"', '"\\ud800"', "0", "-1", "1.5", "01", "1.", "1e3", "x", "notx", "#", "'", "`", "{", "}", "-",
]  # fmt: skip


@FAST
@given(st.text(max_size=200), st.sampled_from(["filter", "mask"]))
def test_any_text_parses_or_raises_a_rego_error(source: str, kind: str) -> None:
    try:
        rule = rego.parse(source, kind)  # type: ignore[arg-type]
    except RegoError as exc:
        assert exc.code.startswith("rego-") and 0 <= exc.position <= len(source)
    else:
        assert rule.kind == kind


@FAST
@given(st.lists(st.sampled_from(TOKENS), max_size=40), st.sampled_from(["filter", "mask"]))
def test_any_token_sequence_parses_or_raises_a_rego_error(tokens: list[str], kind: str) -> None:
    source = " ".join(tokens)
    try:
        rego.parse(source, kind)  # type: ignore[arg-type]
    except RegoError as exc:
        assert exc.code.startswith("rego-")


def test_deep_parentheses_and_long_not_chains_are_typed_errors() -> None:
    for source in ["filter := " + "(" * 5000 + "true" + ")" * 5000, "filter := " + "not " * 5000 + "true"]:
        try:
            rego.parse(source, "filter")
        except RegoError as exc:
            assert exc.code in ("rego-too-deep", "rego-too-many-nodes", "rego-source-too-large")
        else:  # pragma: no cover - must not happen
            raise AssertionError("accepted")


# ----------------------------------------------------------------------------------------------------
# Canonical form: deterministic and idempotent

_leaf = st.one_of(
    st.builds(
        lambda op, fid, v: Leaf(op, fid, "int", NULLABLE[fid], (v,)),
        st.sampled_from(["eq", "not-eq", "lt", "lt-eq", "gt", "gt-eq"]),
        st.sampled_from([1, 2]),
        st.integers(-3, 3),
    ),
    st.builds(
        lambda op, vs: Leaf(op, 3, "string", True, tuple(vs)),
        st.sampled_from(["in", "not-in"]),
        st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4),
    ),
    st.builds(lambda op: Leaf(op, 1, "int", True), st.sampled_from(["is-null", "not-null"])),
    st.builds(Const, st.booleans()),
)
_tree = st.recursive(
    _leaf,
    lambda children: st.builds(
        lambda op, items: Junction(op, tuple(items)),
        st.sampled_from(["and", "or"]),
        st.lists(children, min_size=1, max_size=3),
    ),
    max_leaves=10,
)


def _shuffled(node: Node, rng: random.Random) -> Node:
    if isinstance(node, Junction):
        children = [_shuffled(c, rng) for c in node.children]
        rng.shuffle(children)
        return Junction(node.op, tuple(children))
    if isinstance(node, Leaf) and len(node.values) > 1:
        values = list(node.values)
        rng.shuffle(values)
        return Leaf(node.op, node.field_id, node.type_name, node.nullable, tuple(values))
    return node


@FAST
@given(_tree, st.randoms(use_true_random=False))
def test_canonicalization_is_deterministic_and_idempotent(tree: Node, rng: random.Random) -> None:
    once = canonical(tree)
    assert canonical(once) == once
    assert canonical(_shuffled(tree, rng)) == once, "child and value order never matters"
    assert [_evaluate(once, row) for row in ROWS] == [_evaluate(tree, row) for row in ROWS], "same meaning"


@FAST
@given(_tree)
def test_negation_is_exact_without_a_not_node(tree: Node) -> None:
    negated = negate(tree)
    assert [_evaluate(negated, row) for row in ROWS] == [not _evaluate(tree, row) for row in ROWS]


@FAST
@given(_tree)
def test_canonicalization_is_idempotent_across_the_wire(tree: Node) -> None:
    once = canonical(tree)
    wire = to_wire(once)
    assume(wire is not None and wire is not False)
    plan = parse_restrictions({"required-row-filter": wire}, SCHEMA)
    assert plan.row_filter is not None
    again = canonical(from_predicate(plan.row_filter, lambda fid: NULLABLE[fid]))
    assert to_wire(again) == wire


# ----------------------------------------------------------------------------------------------------
# Lowering of if/else equals evaluating the chain

_INT_LITERAL = st.integers(-2, 2).map(str)
_atom = st.one_of(
    st.builds(lambda c, op, k: f'col("{c}") {op} {k}', st.sampled_from(["n", "r"]),
              st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), _INT_LITERAL),
    st.builds(lambda op, k: f'{k} {op} col("n")', st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), _INT_LITERAL),
    st.builds(lambda op, v: f'col("s") {op} "{v}"', st.sampled_from(["==", "!=", "<", ">="]), st.sampled_from("ab")),
    st.builds(lambda c, op: f'col("{c}") {op} null', st.sampled_from(["n", "s"]), st.sampled_from(["==", "!="])),
    st.just('col("n") in [1, -1, 1]'),
    st.just('col("s") in ["a", "alice"]'),
    st.builds(lambda op: f'col("s") {op} session_user()', st.sampled_from(["==", "!="])),
    st.builds(lambda op: f'session_user() {op} "alice"', st.sampled_from(["==", "!="])),
    st.just('session_user() in ["bob", "carol"]'),
    st.builds(lambda g: f'is_group_member("{g}")', st.sampled_from(sorted(KNOWN_GROUPS))),
    st.sampled_from(["true", "false"]),
)  # fmt: skip
_expr = st.recursive(
    _atom,
    lambda sub: st.one_of(
        sub.map(lambda e: f"not ({e})"),
        st.builds(lambda a, b, op: f"({a}) {op} ({b})", sub, sub, st.sampled_from(["and", "or"])),
    ),
    max_leaves=4,
)
_rule = st.builds(
    lambda branches, fallback: (
        "filter := "
        + " else := ".join(f"{value} if {condition}" for value, condition in branches)
        + (" else := " if branches else "")
        + fallback
    ),
    st.lists(st.tuples(_expr, _expr), max_size=3),
    _expr,
)
_subject = st.builds(
    lambda user, groups: Subject(user, frozenset(groups), KNOWN_GROUPS),
    st.sampled_from(["alice", "bob"]),
    st.sets(st.sampled_from(sorted(KNOWN_GROUPS))),
)


@settings(max_examples=200, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])
@given(_rule, _subject)
def test_lowered_chain_equals_evaluating_the_chain(source: str, subject: Subject) -> None:
    try:
        rule = rego.parse(source, "filter")
        lowered = lower_filter(rule, subject, lambda name: bind_column(SCHEMA, name))
    except PolicyError as exc:
        assume(exc.code in ("rego-too-deep", "rego-too-many-nodes", "resolve-too-deep", "bind-null-test-on-required"))
        return
    for row in ROWS:
        assert _evaluate(lowered.node, row) == _chain(rule, row, subject), (source, row)
    again = lower_filter(rule, subject, lambda name: bind_column(SCHEMA, name))
    assert to_wire(again.node) == to_wire(lowered.node), "lowering is deterministic"


# ----------------------------------------------------------------------------------------------------
# Reference evaluators


def _evaluate(node: Node, row: dict[int, Any]) -> bool:
    """Iceberg two-valued semantics (the expressions spec): a comparison with null is false."""
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Junction):
        results = [_evaluate(child, row) for child in node.children]
        return all(results) if node.op == "and" else any(results)
    value = row[node.field_id]
    if node.op == "is-null":
        return value is None
    if node.op == "not-null":
        return value is not None
    if value is None:
        return node.op in ("not-eq", "not-in")
    literal = node.values[0] if node.values else None
    return {
        "eq": lambda: value == literal,
        "not-eq": lambda: value != literal,
        "lt": lambda: value < literal,
        "lt-eq": lambda: value <= literal,
        "gt": lambda: value > literal,
        "gt-eq": lambda: value >= literal,
        "in": lambda: value in node.values,
        "not-in": lambda: value not in node.values,
    }[node.op]()


_IDS = {"n": 1, "r": 2, "s": 3}


def _value(expr: rego.Expr, row: dict[int, Any], subject: Subject) -> Any:
    if isinstance(expr, rego.Col):
        return row[_IDS[expr.name]]
    if isinstance(expr, rego.SessionUser):
        return subject.user
    assert isinstance(expr, rego.Literal_)
    return int(expr.value) if expr.kind == "number" else expr.value  # type: ignore[arg-type]


def _truth(expr: rego.Expr, row: dict[int, Any], subject: Subject) -> bool:
    """The design's semantics: a null passes !=, <, <= and fails ==, >, >=, in."""
    if isinstance(expr, rego.Literal_):
        return bool(expr.value)
    if isinstance(expr, rego.GroupMember):
        return expr.group in subject.groups
    if isinstance(expr, rego.Negation):
        return not _truth(expr.child, row, subject)
    if isinstance(expr, rego.Junction):
        results = [_truth(item, row, subject) for item in expr.items]
        return all(results) if expr.op == "and" else any(results)
    assert isinstance(expr, rego.Compare)
    left = _value(expr.left, row, subject)
    if expr.op == "in":
        assert isinstance(expr.right, rego.Array)
        return left is not None and left in [_value(item, row, subject) for item in expr.right.items]
    right = _value(expr.right, row, subject)
    null_literal = isinstance(expr.right, rego.Literal_) and expr.right.kind == "null"
    null_literal |= isinstance(expr.left, rego.Literal_) and expr.left.kind == "null"
    if null_literal:
        other = right if isinstance(expr.left, rego.Literal_) and expr.left.kind == "null" else left
        return (other is None) == (expr.op == "==")
    if left is None or right is None:
        op = expr.op
        if isinstance(expr.left, rego.Literal_):  # literal first: read it field-first
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(op, op)
        return op in ("!=", "<", "<=")
    return bool({
        "==": left == right, "!=": left != right, "<": left < right,
        "<=": left <= right, ">": left > right, ">=": left >= right,
    }[expr.op])  # fmt: skip


def _chain(rule: rego.Rule, row: dict[int, Any], subject: Subject) -> bool:
    for value, condition in rule.branches:
        if _truth(condition, row, subject):
            assert not isinstance(value, rego.Action)
            return _truth(value, row, subject)
    assert not isinstance(rule.fallback, rego.Action)
    return _truth(rule.fallback, row, subject)
