"""Fuzz sqe_catalog.config.parse_config/load_config: any document gives a config or one ConfigError line."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sqe_catalog.config import CatalogServerConfig, WarehouseConfig, load_config, parse_config
from sqe_catalog.errors import ConfigError
from tests.fuzz.checks import assert_one_line
from tests.fuzz.config_keys import dotted_keys
from tests.fuzz.strategies import json_scalars, json_values

SECRET = "FUZZSECRETVALUE"
_SERVER_KEYS = [key.split(".", 1)[1] for key in dotted_keys(CatalogServerConfig) if key.startswith("server.")]
_WAREHOUSE_KEYS = dotted_keys(WarehouseConfig)
_values = st.one_of(
    json_scalars,
    st.sampled_from(["s3://warehouse/x", "file:///tmp/w", "arn:aws:iam::1:role/r", SECRET, -1, 0]),
    json_values(max_leaves=5),
)
_warehouse = st.dictionaries(st.one_of(st.sampled_from(_WAREHOUSE_KEYS), st.text(max_size=8)), _values, max_size=8)
_documents = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "server": st.dictionaries(st.one_of(st.sampled_from(_SERVER_KEYS), st.text(max_size=8)), _values),
            "warehouses": st.one_of(st.lists(_warehouse, max_size=3), _values),
        },
    ),
    st.dictionaries(st.text(max_size=10), json_values()),
)


def _parse(document: Any) -> CatalogServerConfig | None:
    try:
        config = parse_config(document)
    except ConfigError as exc:
        assert_one_line(str(exc))
        assert SECRET not in str(exc)
        return None
    assert SECRET not in repr(config)
    return config


@given(_documents)
def test_arbitrary_documents(document: dict[str, Any]) -> None:
    _parse(document)


@given(st.text(max_size=300))
def test_arbitrary_toml_text(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "catalog.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_config(path)
        except ConfigError as exc:
            assert_one_line(str(exc))
