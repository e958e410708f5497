"""Lowering bound policies to canonical, closed Iceberg expressions, and the canonical form itself.

The canonical predicate (``Node``) is a tree of ``Const``, ``Leaf`` and n-ary ``Junction`` nodes, in Iceberg's
two-valued semantics (the expressions spec: a comparison with a null value is false, the ``not-*`` forms are
exact negations). It has no ``not``: negations are pushed into the leaves.

Null semantics (the design's table: a null passes ``!=``, ``<``, ``<=`` and fails ``==``, ``>``, ``>=``, ``in``)
    Readers disagree on ``lt``/``lt-eq`` with a null value (the expressions spec says false, Java's evaluator says
    true), so a policy's ``<``/``<=`` on a nullable column is emitted as ``or(lt(x, v), is-null(x))``: every
    reader then returns the same rows. A NaN follows the rules of null (the expressions spec), so on a float or
    double column ``or(..., is-nan(x))`` is added too, nullable or not; without it a NaN row would fail both a
    comparison and its negation and fall out of every ``if``/``else`` branch. ``!=`` needs nothing (``not-eq`` is
    true for null and NaN everywhere). Because the design's semantics makes each operator the exact complement of
    another (``==``/``!=``, ``<``/``>=``, ``<=``/``>``, ``in``/``not in``), ``not`` is pushed into the comparison
    before this rewrite.

Conditional filters ``filter := r1 if c1 else := r2 if c2 else := f`` become
``(c1 and r1) or (not c1 and c2 and r2) or (not c1 and not c2 and f)``: first matching branch, evaluated left to
right. Context (``session_user()``, ``is_group_member``) folds to constants first, so a context-only condition
just selects its branch.

Canonicalization (deterministic and idempotent): comparisons field-first, Boolean constants folded, nested
junctions of one kind flattened, children sorted (by their canonical JSON) and deduplicated, ``in`` values
sorted and deduplicated (one value becomes ``eq``/``not-eq``). The wire form is a left-deep chain of binary
``and``/``or`` nodes over the sorted children, with ``{"type":"reference","id":N}`` references and bare literals
in the spec's single-value encoding (their type is the referenced field's). The resolved predicate's operation
depth is at most 8 (counted on the n-ary form).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sqe.restrictions.expressions import (
    And,
    Comparison,
    Not,
    NullCheck,
    Or,
    Predicate,
    SetMembership,
    StartsWith,
)
from sqe.restrictions.literals import FLOAT_TYPES, LiteralValue, encode_literal
from sqe_catalog.policies import rego
from sqe_catalog.policies.bind import (
    BoundField,
    Subject,
    require_nullable,
    require_value_type,
    type_literal,
)
from sqe_catalog.policies.errors import PolicyError

__all__ = [
    "MAX_RESOLVED_DEPTH",
    "Const",
    "Junction",
    "Leaf",
    "Node",
    "canonical",
    "depth",
    "from_predicate",
    "lower_filter",
    "negate",
    "select_mask",
    "signature",
    "to_wire",
]

MAX_RESOLVED_DEPTH = 8

# Exact complements in Iceberg's two-valued semantics (null: eq false / not-eq true, and so on). The ordering
# complements are not exact for nulls and are handled in ``negate``.
_COMPLEMENT = {
    "eq": "not-eq",
    "not-eq": "eq",
    "in": "not-in",
    "not-in": "in",
    "is-null": "not-null",
    "not-null": "is-null",
    "is-nan": "not-nan",
    "not-nan": "is-nan",
    "starts-with": "not-starts-with",
    "not-starts-with": "starts-with",
}
_ORDER_COMPLEMENT = {"lt": "gt-eq", "lt-eq": "gt", "gt": "lt-eq", "gt-eq": "lt"}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_REGO_OPS = {"==": "eq", "!=": "not-eq", "<": "lt", "<=": "lt-eq", ">": "gt", ">=": "gt-eq"}
# The design's semantics: exact complements of each Rego operator, used to push ``not`` down.
_REGO_COMPLEMENT = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", "<=": ">", ">": "<="}


# ----------------------------------------------------------------------------------------------------
# The canonical form


@dataclass(frozen=True)
class Const:
    """``true`` or ``false``: what a branch folds to once its context is known."""

    value: bool


@dataclass(frozen=True)
class Leaf:
    """``op`` on one field: no value (null/NaN tests), one (comparisons, starts-with) or several (in/not-in)."""

    op: str
    field_id: int
    type_name: str
    nullable: bool = field(compare=True)
    values: tuple[LiteralValue, ...] = ()


@dataclass(frozen=True)
class Junction:
    """An n-ary ``and``/``or``; canonical form keeps its children flat, sorted and distinct."""

    op: Literal["and", "or"]
    children: tuple[Node, ...]


Node = Const | Leaf | Junction


def negate(node: Node) -> Node:
    """``not node`` without a ``not`` (exact in Iceberg's two-valued semantics)."""
    if isinstance(node, Const):
        return Const(not node.value)
    if isinstance(node, Junction):
        return Junction("or" if node.op == "and" else "and", tuple(negate(c) for c in node.children))
    if node.op in _COMPLEMENT:
        return Leaf(_COMPLEMENT[node.op], node.field_id, node.type_name, node.nullable, node.values)
    complement = Leaf(_ORDER_COMPLEMENT[node.op], node.field_id, node.type_name, node.nullable, node.values)
    # not lt(x, v) is true for a null or NaN x (lt is false there): or(gt-eq(x, v), is-null(x), is-nan(x)).
    return _or_null_or_nan(complement)


def _or_null_or_nan(leaf: Leaf) -> Node:
    """``leaf`` or the field is null (if nullable) or NaN (if float/double): an ordering that passes them."""
    passes = [Leaf("is-null", leaf.field_id, leaf.type_name, True)] if leaf.nullable else []
    if leaf.type_name in FLOAT_TYPES:  # NaN follows the rules of null (expressions spec), required or not
        passes.append(Leaf("is-nan", leaf.field_id, leaf.type_name, leaf.nullable))
    return Junction("or", (leaf, *passes)) if passes else leaf


def canonical(node: Node) -> Node:
    """The canonical form of ``node``; ``canonical(canonical(n)) == canonical(n)``."""
    if isinstance(node, Const):
        return node
    if isinstance(node, Leaf):
        return _canonical_leaf(node)
    absorbing, neutral = node.op == "or", node.op == "and"  # or: true absorbs; and: false absorbs
    children: dict[str, Node] = {}
    for child in node.children:
        folded = canonical(child)
        if isinstance(folded, Const):
            if folded.value is absorbing:
                return Const(absorbing)
            continue  # the neutral constant
        parts = folded.children if isinstance(folded, Junction) and folded.op == node.op else (folded,)
        for part in parts:
            children.setdefault(_key(part), part)
    if not children:
        return Const(neutral)
    if len(children) == 1:
        return next(iter(children.values()))
    return Junction(node.op, tuple(children[k] for k in sorted(children)))


def _canonical_leaf(leaf: Leaf) -> Node:
    if leaf.op in ("is-null", "not-null") and not leaf.nullable:
        return Const(leaf.op == "not-null")  # a required field is never null
    if leaf.op not in ("in", "not-in"):
        return leaf
    values = tuple(sorted(set(leaf.values), key=_sort_key))
    if not values:
        return Const(leaf.op == "not-in")
    if len(values) == 1:
        return Leaf("eq" if leaf.op == "in" else "not-eq", leaf.field_id, leaf.type_name, leaf.nullable, values)
    return Leaf(leaf.op, leaf.field_id, leaf.type_name, leaf.nullable, values)


def _sort_key(value: LiteralValue) -> Any:
    return (type(value).__name__, value)


def _key(node: Node) -> str:
    return json.dumps(_wire(node), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def depth(node: Node) -> int:
    """Operation depth of the canonical n-ary form (a leaf is one operation)."""
    if isinstance(node, Const):
        return 0
    if isinstance(node, Leaf):
        return 1
    return 1 + max(depth(c) for c in node.children)


def to_wire(node: Node) -> Any:
    """The ``required-row-filter`` value: None for true (no filter), ``false`` for deny-all, else the tree."""
    if isinstance(node, Const):
        return None if node.value else False
    return _wire(node)


def _wire(node: Node) -> Any:
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Junction):
        tree = _wire(node.children[0])
        for child in node.children[1:]:
            tree = {"type": node.op, "left": tree, "right": _wire(child)}
        return tree
    ref = {"type": "reference", "id": node.field_id}
    if node.op in ("is-null", "not-null", "is-nan", "not-nan"):
        return {"type": node.op, "child": ref}
    if node.op in ("in", "not-in"):
        return {"type": node.op, "child": ref, "values": [encode_literal(v, node.type_name) for v in node.values]}
    return {"type": node.op, "left": ref, "right": encode_literal(node.values[0], node.type_name)}


def signature(value: Any) -> str:
    """SHA-256 over the canonical JSON text of a wire value."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------------
# From the engine's bound predicate (raw read-restrictions entries go through the same canonical form)


def from_predicate(predicate: Predicate, nullable: Callable[[int], bool]) -> Node:
    """A bound row filter of ``sqe.restrictions`` as a canonical-form tree; ``nullable(field_id)`` from the schema."""
    if isinstance(predicate, And | Or):
        op: Literal["and", "or"] = "and" if isinstance(predicate, And) else "or"
        return Junction(op, (from_predicate(predicate.left, nullable), from_predicate(predicate.right, nullable)))
    if isinstance(predicate, Not):
        return negate(from_predicate(predicate.child, nullable))
    ref = predicate.ref
    optional = nullable(ref.field_id)
    if isinstance(predicate, Comparison):
        return Leaf(predicate.op, ref.field_id, ref.type_name, optional, (predicate.value,))
    if isinstance(predicate, SetMembership):
        return Leaf("not-in" if predicate.negated else "in", ref.field_id, ref.type_name, optional, predicate.values)
    if isinstance(predicate, StartsWith):
        op_name = "not-starts-with" if predicate.negated else "starts-with"
        return Leaf(op_name, ref.field_id, ref.type_name, optional, (predicate.prefix,))
    assert isinstance(predicate, NullCheck)
    return Leaf(predicate.op, ref.field_id, ref.type_name, optional)


# ----------------------------------------------------------------------------------------------------
# From restricted Rego


@dataclass(frozen=True)
class Lowered:
    """A lowered row filter and, per branch, whether its condition folded to true/false or reads rows."""

    node: Node
    branches: tuple[str, ...]  # "true" | "false" | "row-dependent", one per conditional branch


ColumnBinder = Callable[[str], BoundField]


class _Lowering:
    def __init__(self, subject: Subject, columns: ColumnBinder) -> None:
        self._subject = subject
        self._columns = columns
        self._bound: dict[str, BoundField] = {}

    def column(self, name: str) -> BoundField:
        if name not in self._bound:  # bound exactly once per name and load
            self._bound[name] = self._columns(name)
        return self._bound[name]

    def boolean(self, expr: rego.Expr, positive: bool = True) -> Node:
        if isinstance(expr, rego.Literal_):
            assert isinstance(expr.value, bool)
            return Const(expr.value is positive)
        if isinstance(expr, rego.GroupMember):
            return Const(self._subject.is_member(expr.group) is positive)
        if isinstance(expr, rego.Negation):
            return self.boolean(expr.child, not positive)
        if isinstance(expr, rego.Junction):
            op: Literal["and", "or"] = expr.op if positive else ("or" if expr.op == "and" else "and")
            return Junction(op, tuple(self.boolean(item, positive) for item in expr.items))
        assert isinstance(expr, rego.Compare), "the type check admits no other Boolean form"
        return self.compare(expr, positive)

    def compare(self, expr: rego.Compare, positive: bool) -> Node:
        left, right = expr.left, expr.right
        op: str = expr.op
        if op == "in":
            return self._membership(expr, positive)
        if isinstance(right, rego.Col) and not isinstance(left, rego.Col):
            left, right, op = right, left, _FLIP[op]  # field first
        if isinstance(left, rego.SessionUser) or (
            isinstance(right, rego.SessionUser) and isinstance(left, rego.Literal_)
        ):
            literal = right if isinstance(left, rego.SessionUser) else left
            assert isinstance(literal, rego.Literal_) and isinstance(literal.value, str)
            holds = (self._subject.user == literal.value) == (op == "==")
            return Const(holds == positive)
        assert isinstance(left, rego.Col)
        bound = self.column(left.name)
        if isinstance(right, rego.Literal_) and right.kind == "null":
            require_nullable(bound)
            is_null = (op == "==") is positive
            return Leaf("is-null" if is_null else "not-null", bound.field_id, bound.type_name, True)
        if not positive:
            op = _REGO_COMPLEMENT[op]
        ordering = op in ("<", "<=", ">", ">=")
        require_value_type(bound, ordering=ordering)
        if isinstance(right, rego.SessionUser):
            if bound.type_name != "string":
                raise PolicyError("bind-literal-type", f"session_user() is compared with string column {bound.name!r}")
            value: LiteralValue = self._subject.user
        else:
            assert isinstance(right, rego.Literal_)
            value = type_literal(right, bound)
        return self._emit(_REGO_OPS[op], bound, (value,))

    def _membership(self, expr: rego.Compare, positive: bool) -> Node:
        assert isinstance(expr.right, rego.Array)
        if isinstance(expr.left, rego.SessionUser):
            found = any(item.value == self._subject.user for item in expr.right.items)
            return Const(found is positive)
        assert isinstance(expr.left, rego.Col)
        bound = self.column(expr.left.name)
        require_value_type(bound, ordering=False)
        values = tuple(type_literal(item, bound) for item in expr.right.items)
        return self._emit("in" if positive else "not-in", bound, values)

    @staticmethod
    def _emit(op: str, bound: BoundField, values: tuple[LiteralValue, ...]) -> Node:
        leaf = Leaf(op, bound.field_id, bound.type_name, not bound.required, values)
        if op in ("lt", "lt-eq"):
            # the design: a null (and a NaN, as the spec treats it like null) passes < and <=; say so explicitly
            # so that every reader agrees and ``not`` stays the exact complement (>=, > fail both)
            return _or_null_or_nan(leaf)
        return leaf


def lower_filter(rule: rego.Rule, subject: Subject, columns: ColumnBinder) -> Lowered:
    """One closed, canonical predicate for a row-filter rule (conditional chains lowered first-match)."""
    lowering = _Lowering(subject, columns)
    results = [value for value, _ in rule.branches] + [rule.fallback]
    conditions = [lowering.boolean(condition) for _, condition in rule.branches]
    negated = [negate(c) for c in conditions]
    arms = []
    for i, result in enumerate(results):
        assert not isinstance(result, rego.Action)
        guard = [*negated[:i], *([conditions[i]] if i < len(conditions) else [])]
        arms.append(Junction("and", (*guard, lowering.boolean(result))))
    node = canonical(Junction("or", tuple(arms)))
    if depth(node) > MAX_RESOLVED_DEPTH:
        raise PolicyError("resolve-too-deep", f"the resolved row filter nests deeper than {MAX_RESOLVED_DEPTH}")
    return Lowered(node, tuple(_branch_state(canonical(c)) for c in conditions))


def _branch_state(node: Node) -> str:
    return ("true" if node.value else "false") if isinstance(node, Const) else "row-dependent"


def select_mask(rule: rego.Rule, subject: Subject) -> tuple[str, int | None]:
    """The action of a mask rule for ``subject``: the first branch whose context-only condition holds, else the
    fallback; also which branch was chosen (None for the fallback). Every condition is evaluated (an unknown group
    in a later branch still fails), so the result never depends on evaluation order."""
    lowering = _Lowering(subject, _no_columns)
    chosen: int | None = None
    for i, (_value, condition) in enumerate(rule.branches):
        folded = canonical(lowering.boolean(condition))
        assert isinstance(folded, Const), "mask conditions are context-only"
        if folded.value and chosen is None:
            chosen = i
    result = rule.fallback if chosen is None else rule.branches[chosen][0]
    assert isinstance(result, rego.Action)
    return result.name, chosen


def _no_columns(name: str) -> BoundField:  # pragma: no cover - the type check rejects col() in mask conditions
    raise PolicyError("rego-mask-condition-uses-column", "a mask condition cannot read a column")
