"""Fuzz sqe.config.load_config: arbitrary overrides, ``SQE_*`` environment and TOML files.

Every input gives a validated SQEConfig or one ConfigError line, and a secret value never appears in it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sqe.config import SQEConfig, load_config
from sqe.errors import ConfigError
from tests.fuzz.checks import assert_one_line
from tests.fuzz.config_keys import dotted_keys
from tests.fuzz.strategies import json_scalars, json_values

SECRET = "FUZZSECRETVALUE"  # planted in every secret-bearing key; must never reach an error message
KEYS = [*dotted_keys(SQEConfig), "catalog.nope", "storage.tvf.x", "", ".", "catalog..uri", "catalog.uri.deeper"]
_BASE = {"catalog.uri": "http://127.0.0.1:1", "catalog.warehouse": "wh"}

_values = st.one_of(
    json_scalars,
    st.sampled_from(["http://127.0.0.1:9", "ftp://x", "s3://b/p", "vended-credentials", "remote-signing", "auto"]),
    st.sampled_from([SECRET, "x" * 200]),
    json_values(max_leaves=6),
)
_overrides = st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=12)), _values, max_size=6)


def _env_name(key: str) -> str:
    return "SQE_" + "__".join(part.upper() for part in key.split("."))


_env = st.dictionaries(
    st.one_of(st.sampled_from(KEYS).map(_env_name), st.text(max_size=12).map(lambda s: "SQE_" + s)),
    st.one_of(st.text(max_size=30), st.sampled_from(["", "true", "0", "[1]", '["a"]', "[{}]", "12", SECRET])),
    max_size=6,
)


def _load(**kwargs: Any) -> SQEConfig | None:
    try:
        return load_config(**kwargs)
    except ConfigError as exc:
        message = str(exc)
        assert_one_line(message)
        assert SECRET not in message, message
        return None


@given(_overrides)
def test_arbitrary_overrides(overrides: dict[str, Any]) -> None:
    _load(env={}, overrides={**_BASE, **overrides})


@given(_overrides)
def test_arbitrary_overrides_without_base(overrides: dict[str, Any]) -> None:
    _load(env={}, overrides=overrides)


@given(_env, _overrides)
def test_arbitrary_environment(env: dict[str, str], overrides: dict[str, Any]) -> None:
    config = _load(env=env, overrides={**_BASE, **overrides})
    if config is not None:
        assert SECRET not in repr(config)


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1"))))
def test_arbitrary_toml_text(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        _load(path=path, env={})


# ------------------------------------------------------------------------- regressions found by the fuzzer


def test_override_key_with_an_empty_part_fails_instead_of_hanging() -> None:
    # "catalog..uri": the origin lookup strips ".uri", then finds no parent of "catalog." and looped forever.
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(env={}, overrides={**_BASE, "catalog..uri": 1})


def test_unknown_override_key_with_a_line_break_gives_a_one_line_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={}, overrides={**_BASE, "bad\nkey\u2028x": 1})
    assert_one_line(str(caught.value))
    assert "bad\\nkey\\u2028x" in str(caught.value)
