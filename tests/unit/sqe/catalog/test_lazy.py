"""The lazy REST provider: nothing is built (or imported) until a catalog call, and it never pickles."""

from __future__ import annotations

import pickle

import pytest

from sqe.catalog.base import TableIdent
from sqe.catalog.lazy import LazyRestTableProvider
from sqe.config import load_config
from sqe.errors import CatalogUnavailableError


def _provider() -> LazyRestTableProvider:
    config = load_config(
        None,
        overrides={
            "catalog.uri": "http://127.0.0.1:9",  # closed: a real catalog call fails fast
            "catalog.warehouse": "wh",
            "catalog.client_id": "u",
            "catalog.client_secret": "a-secret-value",
            "catalog.max_retries": 0,
        },
    )
    return LazyRestTableProvider(config)


def test_no_catalog_call_builds_nothing() -> None:
    provider = _provider()
    assert provider.default_warehouse() == "wh"
    provider.invalidate(TableIdent("wh", ("ns",), "t"))
    provider.close()
    assert not provider.built
    assert "a-secret-value" not in repr(provider)


def test_first_catalog_call_builds_the_rest_client() -> None:
    provider = _provider()
    with pytest.raises(CatalogUnavailableError):
        provider.load_table(TableIdent("wh", ("ns",), "t"))
    assert provider.built
    provider.close()
    assert not provider.built


def test_refuses_to_pickle() -> None:
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(_provider())
