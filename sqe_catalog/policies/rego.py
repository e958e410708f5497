"""The restricted Rego subset of row-filter and column-mask policies: lexer, parser and save-time type check.

Grammar (the Gravitino design, "Restricted Rego Expressions")::

    program      := filterRule | maskRule
    filterRule   := "filter" ":=" expr [ "if" expr { "else" ":=" expr "if" expr } "else" ":=" expr ]
    maskRule     := "mask" ":=" action [ "if" expr { "else" ":=" action "if" expr } "else" ":=" action ]
    action       := "action" "(" string ")"
    expr         := andExpr { "or" andExpr }
    andExpr      := notExpr { "and" notExpr }
    notExpr      := "not" notExpr | compareExpr
    compareExpr  := primary [ ("==" | "!=" | "<" | "<=" | ">" | ">=" | "in") primary ]
    primary      := "col" "(" string ")" | "session_user" "(" ")" | "is_group_member" "(" string ")"
                  | string | number | "true" | "false" | "null" | "[" literal { "," literal } "]" | "(" expr ")"
    number       := "-"? ("0" | [1-9][0-9]*) ("." [0-9]+)?

Lexing: keywords and built-in names are case-sensitive and only complete tokens (``notebook``, ``truefalse``,
``1and`` are errors, never split); any other word is a bare identifier and invalid. Strings are JSON strings,
decoded exactly once (no other unescaping anywhere). No comments, exponents, leading ``+``, leading zeroes,
trailing decimal points, single quotes or backticks.

Limits (checked while parsing, so an oversized source never builds a large tree): 16 KiB of UTF-8 source,
operation depth 8, 256 AST nodes (an array is one node), 4 KiB of UTF-8 per decoded string, 256 array
elements.

Type rules: a filter's result and conditions are Boolean; a mask's result is ``action(...)`` with a known
action name (a bare string is invalid) and its conditions are Boolean and context-only (no ``col``).
Operand shapes follow the design's table; everything it does not list is invalid.

Every failure is a ``RegoError`` with a stable code and the offset where it was found; nothing else escapes.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Literal

from sqe.restrictions import ACTIONS
from sqe_catalog.policies.errors import RegoError

__all__ = [
    "MAX_ARRAY_ELEMENTS",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_SOURCE_BYTES",
    "MAX_STRING_BYTES",
    "Action",
    "Array",
    "Col",
    "Compare",
    "Expr",
    "GroupMember",
    "Junction",
    "Literal_",
    "Negation",
    "Rule",
    "SessionUser",
    "parse",
]

MAX_SOURCE_BYTES = 16 * 1024
MAX_DEPTH = 8
MAX_NODES = 256
MAX_STRING_BYTES = 4 * 1024
MAX_ARRAY_ELEMENTS = 256
_MAX_PARENS = 32  # parentheses add no operation depth, but recursion must stay bounded

RuleKind = Literal["filter", "mask"]
CompareOp = Literal["==", "!=", "<", "<=", ">", ">=", "in"]

KEYWORDS = frozenset({"filter", "mask", "if", "else", "and", "or", "not", "in", "true", "false", "null"})
BUILTINS = frozenset({"col", "session_user", "is_group_member", "action"})
_OPERATORS = ("==", "!=", "<=", ">=", ":=", "<", ">", "(", ")", "[", "]", ",")
_WORD_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_WORD_CHARS = _WORD_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_WHITESPACE = frozenset(" \t\r\n")


# ----------------------------------------------------------------------------------------------------
# AST (positions are 0-based character offsets into the source)


@dataclass(frozen=True)
class Col:
    """``col("name")``: the value of a column of the row."""

    name: str  # as written; bound to the table's schema when the policy is applied to a load
    pos: int


@dataclass(frozen=True)
class SessionUser:
    """``session_user()``: the end user the request is served for."""

    pos: int


@dataclass(frozen=True)
class GroupMember:
    """``is_group_member("group")``: whether that end user is in the group."""

    group: str  # folded to true or false for the end user of each load
    pos: int


@dataclass(frozen=True)
class Literal_:
    """A literal; ``value`` is a str, a bool, None, or a number kept as its exact source text."""

    kind: Literal["string", "number", "boolean", "null"]
    value: str | bool | None
    pos: int


@dataclass(frozen=True)
class Array:
    """``[literal, ...]``: the right side of ``in`` (one AST node however long)."""

    items: tuple[Literal_, ...]
    pos: int


@dataclass(frozen=True)
class Compare:
    """``left op right`` with one of ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``."""

    op: CompareOp
    left: Expr
    right: Expr
    pos: int


@dataclass(frozen=True)
class Junction:
    """A chain of ``and`` (or of ``or``), kept flat: ``a and b and c`` is one node of three items."""

    op: Literal["and", "or"]
    items: tuple[Expr, ...]
    pos: int


@dataclass(frozen=True)
class Negation:
    """``not child``."""

    child: Expr  # pushed down to the leaves when lowered (``not (a and b)`` is ``not a or not b``)
    pos: int


@dataclass(frozen=True)
class Action:
    """``action("name")``: a mask rule's result, naming one of the restriction actions."""

    name: str  # checked against the known actions by the save-time type check
    pos: int


Expr = Col | SessionUser | GroupMember | Literal_ | Array | Compare | Junction | Negation
Result = Expr | Action


@dataclass(frozen=True)
class Rule:
    """One complete rule: ``branches`` are (result, condition) in order, then the unconditional ``fallback``."""

    kind: RuleKind
    branches: tuple[tuple[Result, Expr], ...]
    fallback: Result


# ----------------------------------------------------------------------------------------------------
# Lexer


@dataclass(frozen=True)
class _Token:
    """One lexeme; ``end`` marks the end of the source."""

    kind: Literal["word", "op", "string", "number", "end"]
    text: str  # the word, operator or number text; the decoded value for a string
    pos: int


def _tokens(source: str) -> Iterator[_Token]:
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch in _WHITESPACE:
            i += 1
        elif ch in _WORD_START:
            i = yield from _word(source, i)
        elif ch in _DIGITS or ch == "-":
            i = yield from _number(source, i)
        elif ch == '"':
            i = yield from _string(source, i)
        else:
            op = next((o for o in _OPERATORS if source.startswith(o, i)), None)
            if op is None:
                raise RegoError("rego-unexpected-character", f"unexpected character {_show(ch)}", i)
            yield _Token("op", op, i)
            i += len(op)
    yield _Token("end", "", n)


def _show(ch: str) -> str:
    return repr(ch) if ch.isprintable() else f"U+{ord(ch):04X}"


def _word(source: str, start: int) -> Generator[_Token, None, int]:
    end = start
    while end < len(source) and source[end] in _WORD_CHARS:
        end += 1
    yield _Token("word", source[start:end], start)
    return end


def _number(source: str, start: int) -> Generator[_Token, None, int]:
    i, n = start, len(source)
    if source[i] == "-":
        i += 1
    if i >= n or source[i] not in _DIGITS:
        raise RegoError("rego-invalid-number", "'-' must start a number", start)
    if source[i] == "0":
        i += 1
        if i < n and source[i] in _DIGITS:
            raise RegoError("rego-invalid-number", "numbers have no leading zeroes", start)
    else:
        while i < n and source[i] in _DIGITS:
            i += 1
    if i < n and source[i] == ".":
        i += 1
        if i >= n or source[i] not in _DIGITS:
            raise RegoError("rego-invalid-number", "a decimal point needs digits after it", start)
        while i < n and source[i] in _DIGITS:
            i += 1
    if i < n and (source[i] in _WORD_CHARS or source[i] == "."):
        # 1and, 1e5, 1.2.3: a number must end at a delimiter; nothing is split into adjacent tokens
        raise RegoError("rego-invalid-number", "a number must end at a delimiter (no exponents or suffixes)", start)
    yield _Token("number", source[start:i], start)
    return i


def _string(source: str, start: int) -> Generator[_Token, None, int]:
    i, n = start + 1, len(source)
    while i < n and source[i] != '"':
        i += 2 if source[i] == "\\" else 1
    if i >= n:
        raise RegoError("rego-invalid-string", "unterminated string", start)
    raw = source[start : i + 1]
    try:
        value = json.loads(raw)  # JSON string syntax, decoded exactly once
        encoded = value.encode("utf-8")  # a lone surrogate escape is not text
    except (ValueError, UnicodeEncodeError):
        raise RegoError("rego-invalid-string", "not a valid JSON string", start) from None
    if not isinstance(value, str):  # pragma: no cover - a quoted JSON value is always a string
        raise RegoError("rego-invalid-string", "not a valid JSON string", start)
    if len(encoded) > MAX_STRING_BYTES:
        raise RegoError("rego-string-too-long", f"a string is longer than {MAX_STRING_BYTES} bytes", start)
    yield _Token("string", value, start)
    return i + 1


# ----------------------------------------------------------------------------------------------------
# Parser


class _Parser:
    def __init__(self, source: str) -> None:
        self._tokens = list(_tokens(source))
        self._at = 0
        self._nodes = 0
        self._parens = 0

    # -- token helpers

    @property
    def _peek(self) -> _Token:
        return self._tokens[self._at]

    def _next(self) -> _Token:
        token = self._tokens[self._at]
        if token.kind != "end":
            self._at += 1
        return token

    def _is(self, kind: str, text: str) -> bool:
        token = self._peek
        return token.kind == kind and token.text == text

    def _expect(self, kind: str, text: str, what: str) -> _Token:
        token = self._next()
        if token.kind != kind or token.text != text:
            self._unexpected(token, f"expected {what}")
        return token

    @staticmethod
    def _unexpected(token: _Token, expected: str) -> None:
        if token.kind == "end":
            raise RegoError("rego-unexpected-end", f"the expression ends early: {expected}", token.pos)
        if token.kind == "word" and token.text not in KEYWORDS | BUILTINS:
            raise RegoError(
                "rego-bare-identifier",
                f'bare identifier {token.text!r}: column names are written col("name")',
                token.pos,
            )
        shown = token.text if token.kind != "string" else "a string"
        raise RegoError("rego-unexpected-token", f"unexpected {shown!r}: {expected}", token.pos)

    def _node(self, pos: int) -> None:
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise RegoError("rego-too-many-nodes", f"more than {MAX_NODES} expression nodes", pos)

    @staticmethod
    def _op(node: Expr) -> Expr:
        """Check the operation depth of a freshly built operation (bottom-up; the node limit bounds recursion)."""
        if _depth(node) > MAX_DEPTH:
            raise RegoError("rego-too-deep", f"operations nest deeper than {MAX_DEPTH}", node.pos)
        return node

    # -- rule

    def rule(self) -> Rule:
        head = self._next()
        if head.kind != "word" or head.text not in ("filter", "mask"):
            if head.kind == "string":
                raise RegoError("rego-invalid-rule-head", "the rule head is filter or mask, not a string", head.pos)
            self._unexpected(head, "a rule 'filter :=' or 'mask :='")
        kind: RuleKind = "filter" if head.text == "filter" else "mask"
        self._expect("op", ":=", "':=' after the rule head")
        first = self._result(kind)
        if not self._is("word", "if"):
            self._end()
            return Rule(kind, (), first)
        branches = []
        value = first
        while True:
            self._expect("word", "if", "'if'")
            branches.append((value, self._expr()))
            if not self._is("word", "else"):
                raise RegoError(
                    "rego-missing-fallback", "a conditional rule needs a final unconditional 'else :='", self._peek.pos
                )
            self._next()
            self._expect("op", ":=", "':=' after 'else'")
            value = self._result(kind)
            if not self._is("word", "if"):
                self._end()
                return Rule(kind, tuple(branches), value)

    def _end(self) -> None:
        token = self._peek
        if token.kind != "end":
            if token.kind == "op" and token.text in ("==", "!=", "<", "<=", ">", ">="):
                raise RegoError("rego-chained-comparison", "comparisons cannot be chained", token.pos)
            if token.kind == "word" and token.text == "in":
                raise RegoError("rego-chained-comparison", "comparisons cannot be chained", token.pos)
            self._unexpected(token, "the end of the rule")

    def _result(self, kind: RuleKind) -> Result:
        if kind == "mask":
            if not self._is("word", "action"):
                token = self._peek
                if token.kind == "string":
                    raise RegoError("rego-mask-not-action", 'a mask result is action("name"), not a string', token.pos)
                raise RegoError("rego-mask-not-action", 'a mask result must be action("name")', token.pos)
            return self._action()
        return self._expr()

    def _action(self) -> Action:
        start = self._next()
        self._node(start.pos)
        self._expect("op", "(", "'(' after action")
        name = self._next()
        if name.kind != "string":
            self._unexpected(name, "an action name string")
        self._expect("op", ")", "')'")
        if name.text not in ACTIONS:
            raise RegoError("rego-unknown-action", f"unknown mask action {name.text!r}", name.pos)
        return Action(name.text, start.pos)

    # -- expressions (depth counts operations: comparisons, and, or, not)

    def _expr(self) -> Expr:
        return self._junction("or")

    def _junction(self, op: Literal["and", "or"]) -> Expr:
        pos = self._peek.pos
        first = self._junction("and") if op == "or" else self._negation()
        if not self._is("word", op):
            return first
        self._node(pos)
        items = [first]
        while self._is("word", op):
            self._next()
            items.append(self._junction("and") if op == "or" else self._negation())
        return self._op(Junction(op, tuple(items), pos))

    def _negation(self) -> Expr:
        if self._is("word", "not"):
            token = self._next()
            self._node(token.pos)
            return self._op(Negation(self._negation(), token.pos))
        return self._compare()

    def _compare(self) -> Expr:
        left = self._primary()
        token = self._peek
        is_op = token.kind == "op" and token.text in ("==", "!=", "<", "<=", ">", ">=")
        if not (is_op or (token.kind == "word" and token.text == "in")):
            return left
        self._next()
        self._node(token.pos)
        right = self._primary()
        after = self._peek
        if (after.kind == "op" and after.text in ("==", "!=", "<", "<=", ">", ">=")) or (
            after.kind == "word" and after.text == "in"
        ):
            raise RegoError("rego-chained-comparison", "comparisons cannot be chained", after.pos)
        op: CompareOp = token.text  # type: ignore[assignment]
        return self._op(Compare(op, left, right, token.pos))

    def _primary(self) -> Expr:
        token = self._next()
        if token.kind == "string":
            self._node(token.pos)
            return Literal_("string", token.text, token.pos)
        if token.kind == "number":
            self._node(token.pos)
            return Literal_("number", token.text, token.pos)
        if token.kind == "op" and token.text == "(":
            self._parens += 1
            if self._parens > _MAX_PARENS:
                raise RegoError("rego-too-deep", f"parentheses nest deeper than {_MAX_PARENS}", token.pos)
            inner = self._expr()
            self._expect("op", ")", "')'")
            self._parens -= 1
            return inner
        if token.kind == "op" and token.text == "[":
            return self._array(token)
        if token.kind == "word":
            return self._word(token)
        self._unexpected(token, "a value, col(...), session_user(), is_group_member(...) or '('")
        raise AssertionError("unreachable")  # pragma: no cover

    def _word(self, token: _Token) -> Expr:
        self._node(token.pos)
        if token.text in ("true", "false"):
            return Literal_("boolean", token.text == "true", token.pos)
        if token.text == "null":
            return Literal_("null", None, token.pos)
        if token.text == "col":
            return Col(self._string_argument("a column name string"), token.pos)
        if token.text == "is_group_member":
            return GroupMember(self._string_argument("a group name string"), token.pos)
        if token.text == "session_user":
            self._expect("op", "(", "'(' after session_user")
            self._expect("op", ")", "')': session_user() takes no argument")
            return SessionUser(token.pos)
        if token.text == "action":
            raise RegoError("rego-unexpected-action", "action(...) is only a mask rule's result", token.pos)
        self._unexpected(token, "a value, col(...), session_user(), is_group_member(...) or '('")
        raise AssertionError("unreachable")  # pragma: no cover

    def _string_argument(self, what: str) -> str:
        self._expect("op", "(", "'('")
        argument = self._next()
        if argument.kind != "string":
            self._unexpected(argument, what)
        self._expect("op", ")", "')'")
        return argument.text

    def _array(self, start: _Token) -> Array:
        self._node(start.pos)
        items: list[Literal_] = []
        while True:
            token = self._next()
            if token.kind == "op" and token.text == "]" and not items:
                raise RegoError("rego-empty-array", "an array needs at least one literal", start.pos)
            item = self._array_item(token)
            items.append(item)
            if len(items) > MAX_ARRAY_ELEMENTS:
                raise RegoError("rego-array-too-large", f"more than {MAX_ARRAY_ELEMENTS} array elements", start.pos)
            separator = self._next()
            if separator.kind == "op" and separator.text == "]":
                break
            if separator.kind != "op" or separator.text != ",":
                self._unexpected(separator, "',' or ']'")
        kinds = {item.kind for item in items}
        if len(kinds) > 1:
            raise RegoError("rego-mixed-array", "array elements must all have one literal type", start.pos)
        return Array(tuple(items), start.pos)

    def _array_item(self, token: _Token) -> Literal_:
        if token.kind == "string":
            item = Literal_("string", token.text, token.pos)
        elif token.kind == "number":
            item = Literal_("number", token.text, token.pos)
        elif token.kind == "word" and token.text in ("true", "false"):
            item = Literal_("boolean", token.text == "true", token.pos)
        elif token.kind == "word" and token.text == "null":
            raise RegoError("rego-null-in-array", "arrays cannot contain null", token.pos)
        elif token.kind == "op" and token.text == "[":
            raise RegoError("rego-nested-array", "arrays cannot be nested", token.pos)
        else:
            self._unexpected(token, "a literal array element")
            raise AssertionError("unreachable")  # pragma: no cover
        return item  # elements count against the array limit, the array itself as one node


def _depth(expr: Expr) -> int:
    """Operation depth: comparisons, and, or and not count one level each; values count none."""
    if isinstance(expr, Compare):
        return 1 + max(_depth(expr.left), _depth(expr.right))
    if isinstance(expr, Junction):
        return 1 + max(_depth(item) for item in expr.items)
    if isinstance(expr, Negation):
        return 1 + _depth(expr.child)
    return 0


# ----------------------------------------------------------------------------------------------------
# Type check (no schema: columns are typed when the policy is bound to a table)


def _is_context_value(expr: Expr) -> bool:
    return isinstance(expr, SessionUser)


def _check_boolean(expr: Expr, *, context_only: bool) -> None:
    """``expr`` must be a Boolean predicate; with ``context_only`` it must not read row values."""
    if isinstance(expr, Junction):
        for item in expr.items:
            _check_boolean(item, context_only=context_only)
    elif isinstance(expr, Negation):
        _check_boolean(expr.child, context_only=context_only)
    elif isinstance(expr, Compare):
        _check_compare(expr, context_only=context_only)
    elif (isinstance(expr, Literal_) and expr.kind == "boolean") or isinstance(expr, GroupMember):
        return
    elif isinstance(expr, Col):
        raise RegoError("rego-not-boolean", 'a column is not a predicate: compare it, e.g. col("x") == true', expr.pos)
    else:
        raise RegoError("rego-not-boolean", "expected a Boolean expression", expr.pos)


def _check_compare(expr: Compare, *, context_only: bool) -> None:
    left, right, op = expr.left, expr.right, expr.op
    if context_only and (isinstance(left, Col) or isinstance(right, Col)):
        raise RegoError(
            "rego-mask-condition-uses-column",
            "a mask condition is context-only: col(...) cannot appear in it",
            expr.pos,
        )
    if isinstance(left, GroupMember) or isinstance(right, GroupMember):
        raise RegoError("rego-invalid-operands", "is_group_member(...) cannot be compared", expr.pos)
    if op == "in":
        _check_in(expr)
        return
    if isinstance(left, Array) or isinstance(right, Array):
        raise RegoError("rego-invalid-operands", "an array is only the right operand of 'in'", expr.pos)
    shapes = {_shape(left), _shape(right)}
    if shapes == {"column"}:
        raise RegoError("rego-invalid-operands", "column-to-column comparisons are not supported", expr.pos)
    if shapes == {"column", "null"} or shapes == {"column", "literal"}:
        if "null" in shapes and op not in ("==", "!="):
            raise RegoError("rego-invalid-operands", "null is only compared with == or !=", expr.pos)
        return
    if shapes == {"column", "user"} or shapes == {"user", "literal"}:
        if op not in ("==", "!="):
            raise RegoError("rego-invalid-operands", "session_user() is only compared with == or !=", expr.pos)
        if "literal" in shapes:
            literal = left if isinstance(left, Literal_) else right
            assert isinstance(literal, Literal_)
            if literal.kind != "string":
                raise RegoError("rego-invalid-operands", "session_user() is compared with a string", expr.pos)
        return
    raise RegoError("rego-invalid-operands", "a comparison needs a column or session_user() and a value", expr.pos)


def _shape(expr: Expr) -> str:
    if isinstance(expr, Col):
        return "column"
    if isinstance(expr, SessionUser):
        return "user"
    if isinstance(expr, Literal_):
        return "null" if expr.kind == "null" else "literal"
    return "predicate"  # a parenthesised predicate as an operand: never valid


def _check_in(expr: Compare) -> None:
    if not isinstance(expr.right, Array):
        raise RegoError("rego-invalid-operands", "'in' needs a literal array on its right", expr.pos)
    if isinstance(expr.left, Col):
        return
    if _is_context_value(expr.left):
        if any(item.kind != "string" for item in expr.right.items):
            raise RegoError("rego-invalid-operands", "session_user() in [...] needs an array of strings", expr.pos)
        return
    raise RegoError("rego-invalid-operands", "'in' needs a column or session_user() on its left", expr.pos)


def _check_rule(rule: Rule) -> None:
    results = [value for value, _ in rule.branches] + [rule.fallback]
    for _value, condition in rule.branches:
        _check_boolean(condition, context_only=rule.kind == "mask")
    for value in results:
        if rule.kind == "filter":
            assert not isinstance(value, Action)
            _check_boolean(value, context_only=False)


def parse(source: str, kind: RuleKind) -> Rule:
    """Parse and type-check one policy expression whose rule head must be ``kind``; RegoError otherwise."""
    if not isinstance(source, str):
        raise RegoError("rego-invalid-source", "the expression must be a string", 0)
    try:
        size = len(source.encode("utf-8"))
    except UnicodeEncodeError:
        raise RegoError("rego-invalid-source", "the expression is not valid Unicode text", 0) from None
    if size > MAX_SOURCE_BYTES:
        raise RegoError("rego-source-too-large", f"the expression is longer than {MAX_SOURCE_BYTES} bytes", 0)
    rule = _Parser(source).rule()
    if rule.kind != kind:
        expected = "filter" if kind == "filter" else "mask"
        raise RegoError(
            "rego-wrong-rule-head",
            f"a {'row-filter' if kind == 'filter' else 'column-mask'} policy needs a '{expected} :=' rule",
            0,
        )
    _check_rule(rule)
    return rule
