"""The one identifier rule (``sqe_catalog.identifiers``) and the stored form of dotted namespace levels."""

from __future__ import annotations

from typing import Any

import pytest

from sqe_catalog.errors import BadRequestError
from sqe_catalog.identifiers import (
    from_storage_namespace,
    parse_namespace_path,
    storage_namespace,
    validate_name,
    validate_namespace,
)

ODD_NAMES = [
    "",
    ".",
    "..",
    "a/b",
    "a\\b",
    "../x",
    "a\x00b",
    "a\x1fb",
    "a\nb",
    "a\u200bb",  # zero-width space (Cf)
    "a\u202eb",  # right-to-left override (Cf)
    "a\u2028b",  # line separator (Zl)
    "a\u2029b",  # paragraph separator (Zp)
    "a\ud800b",  # lone surrogate (Cs)
    "a\u00a0b",  # no-break space
    "a\ufffd\ufffdb",  # a path segment "a%FF%FEb": the server decodes bytes that are not UTF-8 to U+FFFD
    "a#b",  # a URI's fragment: pyiceberg's FileIO cut every path of such a table at it
    "a?b",  # a URI's query: likewise
    " ",
    "\t",
    " padded",
    "padded ",
    "x" * 256,
]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_odd_names_are_refused_with_a_400(name: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        validate_name(name, "table name")
    assert caught.value.status == 400
    if len(name) > 2:
        assert name not in caught.value.message, "the odd name is never echoed back"


@pytest.mark.parametrize("name", ["orders", "a.b", "v1.2", "Straße", "名前", "with space", "x" * 255, "50%"])
def test_ordinary_names_pass(name: str) -> None:
    assert validate_name(name, "table name") == name


@pytest.mark.parametrize("value", [None, 3, b"x", ["x"]])
def test_non_strings_are_refused(value: Any) -> None:
    with pytest.raises(BadRequestError):
        validate_name(value, "table name")


def test_a_dotted_level_is_one_level_on_the_wire() -> None:
    assert parse_namespace_path("a.b\x1fc") == ("a.b", "c")
    assert validate_namespace(["a.b"]) == ("a.b",)


@pytest.mark.parametrize("namespace", [("a.b",), ("a", "b"), ("a%2Eb",), ("%",), ("a.", ".b"), ("%252E.",)])
def test_storage_form_is_injective_and_reversible(namespace: tuple[str, ...]) -> None:
    stored = storage_namespace(namespace)
    assert all("." not in level for level in stored)
    assert from_storage_namespace(stored) == namespace


def test_dotted_and_nested_namespaces_never_share_a_stored_form() -> None:
    assert ".".join(storage_namespace(("a.b",))) != ".".join(storage_namespace(("a", "b")))


def test_namespace_depth_and_length_are_limited() -> None:
    with pytest.raises(BadRequestError):
        validate_namespace(["x"] * 17)
    with pytest.raises(BadRequestError):
        validate_namespace(["." * 1 + "a" * 100, "." * 60])  # escaping counts against the column length
