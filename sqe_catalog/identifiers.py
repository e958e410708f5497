"""The one identifier rule of ``sqe-catalog``: every namespace level, table name and view name is checked here.

Every route (create, stage-create, register, rename source and target, load, exists, drop, list with
``parent``, the view routes) validates through this module before anything is looked up, so an odd name is a 400
ErrorModel and never a 404 or 500, and every name that reaches an object key has passed it. The rule is at
least as strict as Polaris's: a name is refused when it

- is not a string, is empty, or is longer than ``MAX_NAME_LENGTH`` characters;
- is ``.`` or ``..``, or contains ``/`` or ``\\`` (path separators and traversal forms);
- contains ``#`` or ``?``: names become parts of locations, and pyiceberg's FileIO parses a location as a URI,
  cutting it at a fragment or query (a table ``u#x``'s files went to ``<warehouse>/<ns>/u``, outside its location);
- contains a control, format or invisible character (Unicode categories Cc, Cf, Cs = lone surrogates, Co, Cn,
  Zl, Zp), a space character other than U+0020, or U+FFFD (what the server makes of a byte that is not UTF-8);
- is whitespace only, or starts or ends with whitespace (padded names look identical to unpadded ones).

A namespace level may contain ``.``: the wire separator is the unit separator (``NAMESPACE_SEPARATOR``).
``storage_namespace`` escapes ``.`` for pyiceberg's SQL catalog, which joins levels with ``.``.
"""

from __future__ import annotations

import re
import unicodedata

from sqe import vocabulary
from sqe_catalog.errors import BadRequestError

__all__ = [
    "MAX_NAMESPACE_DEPTH",
    "MAX_NAME_LENGTH",
    "URI_CHARACTERS",
    "Namespace",
    "from_storage_namespace",
    "parse_namespace_path",
    "storage_namespace",
    "validate_name",
    "validate_namespace",
]

Namespace = tuple[str, ...]

# pyiceberg's SQL catalog keeps names in VARCHAR(255) columns; the stored namespace is its escaped levels joined.
MAX_NAME_LENGTH = 255
MAX_NAMESPACE_DEPTH = 16
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_PATH_CHARACTERS = frozenset("/\\")
URI_CHARACTERS = frozenset("#?")  # a URI's fragment and query: pyiceberg's FileIO cuts a location at them


def _character_problem(ch: str) -> str | None:
    if ch in _PATH_CHARACTERS:
        return "a path separator"
    if ch in URI_CHARACTERS:
        return "'#' or '?' (locations are parsed as URIs, which end their path there)"
    category = unicodedata.category(ch)
    if category in _REFUSED_CATEGORIES:
        return f"a control or invisible character (U+{ord(ch):04X})"
    if category == "Zs" and ch != " ":
        return f"a special space character (U+{ord(ch):04X})"
    if ch == "\ufffd":  # what an undecodable byte in the request path became: the client meant something else
        return "the replacement character U+FFFD (a byte that is not UTF-8)"
    return None


def validate_name(name: object, what: str) -> str:
    """``name`` if it passes the rule above; otherwise a one-line 400 that never echoes the odd name back."""
    if not isinstance(name, str) or not name:
        raise BadRequestError(f"{what} must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise BadRequestError(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if name in (".", ".."):
        raise BadRequestError(f"{what} must not be '.' or '..'")
    for ch in name:
        if (problem := _character_problem(ch)) is not None:
            raise BadRequestError(f"{what} must not contain {problem}")
    if not name.strip():
        raise BadRequestError(f"{what} must not be whitespace only")
    if name != name.strip():
        raise BadRequestError(f"{what} must not start or end with whitespace")
    return name


def validate_namespace(levels: object) -> Namespace:
    """A namespace as a non-empty tuple of valid levels whose stored form fits pyiceberg's column."""
    if not isinstance(levels, list | tuple) or not levels:
        raise BadRequestError("namespace must be a non-empty list of strings")
    if len(levels) > MAX_NAMESPACE_DEPTH:
        raise BadRequestError(f"namespace has more than {MAX_NAMESPACE_DEPTH} levels")
    checked = tuple(validate_name(level, "namespace level") for level in levels)
    if len(".".join(storage_namespace(checked))) > MAX_NAME_LENGTH:
        raise BadRequestError(f"namespace is longer than {MAX_NAME_LENGTH} characters")
    return checked


def parse_namespace_path(raw: str) -> Namespace:
    """A namespace from a path segment or the ``parent`` query parameter (levels joined by the separator)."""
    return validate_namespace(raw.split(vocabulary.NAMESPACE_SEPARATOR))


def _escape_level(level: str) -> str:
    return level.replace("%", "%25").replace(".", "%2E")


_ESCAPES = re.compile("%(25|2E)")


def _unescape_level(level: str) -> str:
    return _ESCAPES.sub(lambda m: "%" if m.group(1) == "25" else ".", level)


def storage_namespace(namespace: Namespace) -> Namespace:
    """Levels as stored by pyiceberg's SQL catalog: ``.`` and ``%`` escaped, so ``("a.b",)`` never reads as
    ``("a", "b")``. Injective; ``from_storage_namespace`` is its inverse."""
    return tuple(_escape_level(level) for level in namespace)


def from_storage_namespace(stored: Namespace) -> Namespace:
    return tuple(_unescape_level(level) for level in stored)
