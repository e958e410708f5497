"""The shared config loader: key paths, field lookup by error location, and env conversion by field type."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import SecretStr

from sqe._config_loader import Array, ConfigSection, Origins, Unset, apply_env, build, dotted, field_type, reveal


class _Item(ConfigSection):
    name: str
    note: Unset[str] = None


class _Section(ConfigSection):
    count: int = 1
    ratio: float = 0.5
    flag: Unset[bool] = None
    secret: Unset[SecretStr] = None
    mode: Literal["a", "b"] = "a"
    items: Array[_Item] = ()


class _Root(ConfigSection):
    section: _Section


class _Failed(Exception):
    pass


def _build(tree: dict[str, object], env: dict[str, str] | None = None) -> _Root:
    origins = Origins(_Failed)
    apply_env(tree, env or {}, "T_", _Root, origins)
    return build(_Root, tree, origins, {"section.mode": {"c": "c is retired"}})


def _message(tree: dict[str, object], env: dict[str, str] | None = None) -> str:
    with pytest.raises(_Failed) as info:
        _build(tree, env)
    return str(info.value)


def test_dotted_keys_and_field_lookup() -> None:
    assert dotted(("section", "items", 1, "note")) == "section.items[1].note"
    assert field_type(_Root, ("section", "items", 0, "name")) is str
    assert field_type(_Root, ("section", "nope")) is None


def test_optional_string_set_and_unset() -> None:
    root = _build({"section": {"items": [{"name": "x", "note": "n"}, {"name": "y"}, {"name": "z", "note": ""}]}})
    assert [i.note for i in root.section.items] == ["n", None, None]


def test_env_values_are_converted_by_field_type() -> None:
    env = {"T_SECTION__COUNT": "7", "T_SECTION__RATIO": "2", "T_SECTION__FLAG": "true", "T_SECTION__SECRET": "s"}
    section = _build({}, env).section
    assert (section.count, section.ratio, section.flag) == (7, 2.0, True)
    assert isinstance(section.secret, SecretStr) and section.secret.get_secret_value() == "s"


@pytest.mark.parametrize(
    ("tree", "env", "expected"),
    [
        ({"section": {"count": "7"}}, {}, "section.count: expected an integer, got a string"),
        ({}, {"T_SECTION__COUNT": "seven"}, "section.count (set by T_SECTION__COUNT): expected an integer"),
        ({}, {"T_SECTION__ITEMS": '[{"note": 1}]'}, "section.items[0].name (set by T_SECTION__ITEMS): required"),
        ({"section": {"mode": "c"}}, {}, 'section.mode: "c" is not supported (c is retired); use "a" or "b"'),
        ({"section": {"mode": 3}}, {}, 'section.mode: expected one of "a" or "b", got an integer'),
        ({}, {"T_SECTION__NOPE": "1"}, "T_SECTION__NOPE: unknown key section.nope"),
    ],
)
def test_errors_name_the_key_and_what_set_it(tree: dict[str, object], env: dict[str, str], expected: str) -> None:
    assert _message(tree, env).startswith(expected)


def test_a_rejected_secret_is_never_echoed() -> None:
    message = _message({"section": {"secret": ["TOP-SECRET-VALUE"]}})
    assert message == "section.secret: expected a string, got a list"


def test_model_copy_builds_a_new_validated_model_and_leaves_the_original_alone() -> None:
    from pydantic import SecretStr, ValidationError

    from sqe.config import load_config

    base = load_config(
        env={},
        overrides={
            "catalog.uri": "http://127.0.0.1:1",
            "catalog.warehouse": "d",
            "catalog.client_id": "a",
            "catalog.client_secret": "s",
        },
    )
    changed = base.catalog.model_copy(update={"client_id": None, "client_secret": None, "token": SecretStr("t")})
    assert changed is not base.catalog
    assert base.catalog.client_id == "a" and base.catalog.token is None  # the original is untouched
    assert changed.client_id is None and changed.token is not None
    with pytest.raises(ValidationError):
        base.catalog.model_copy(update={"max_retries": "five"})  # validated like the file: strict types


def test_a_prefix_may_name_the_section() -> None:
    """``section=``: ``<PREFIX><KEY>`` sets ``<section>.<key>`` (how ``sqe serve`` names ``SQE_SERVER_<KEY>``)."""

    def build_with(env: dict[str, str]) -> _Root:
        origins = Origins(_Failed)
        tree: dict[str, object] = {"section": {"ratio": 0.25}}
        apply_env(tree, env, "T_SECTION_", _Root, origins, section="section")
        return build(_Root, tree, origins)

    section = build_with({"T_SECTION_COUNT": "7", "T_SECTION_SECRET": "s", "T_OTHER": "x"}).section
    assert (section.count, section.ratio) == (7, 0.25) and reveal(section.secret) == "s"
    # "<PREFIX minus its _>_<SECTION>__<KEY>" belongs to a loader with the shorter prefix: left alone
    assert build_with({"T_SECTION__COUNT": "nope"}).section.count == 1
    with pytest.raises(_Failed, match=r"^T_SECTION_NOPE: unknown key section\.nope$"):
        build_with({"T_SECTION_NOPE": "1"})
    with pytest.raises(_Failed, match=r"^section\.count \(set by T_SECTION_COUNT\): expected an integer$"):
        build_with({"T_SECTION_COUNT": "seven"})
    # without section=, the same variables are not key overrides of this model (no "__" after the prefix)
    origins = Origins(_Failed)
    tree: dict[str, object] = {}
    apply_env(tree, {"T_SECTION_COUNT": "7"}, "T_SECTION_", _Root, origins)
    assert tree == {}
