"""The early first token (``sqe.catalog._early_token``): its failure reaches the caller typed, it never pickles,
and its repr names no secret. (Against the real catalog: ``tests/e2e/test_early_token.py``.)"""

from __future__ import annotations

import pickle

import pytest

from sqe.catalog._early_token import EarlyToken
from sqe.config import load_config
from sqe.errors import CatalogUnavailableError

SECRET = "a-secret-value"


def _early() -> EarlyToken:
    config = load_config(
        None,
        overrides={
            "catalog.uri": "http://127.0.0.1:9",  # closed: the token request fails fast
            "catalog.warehouse": "wh",
            "catalog.client_id": "u",
            "catalog.client_secret": SECRET,
            "catalog.max_retries": 0,
        },
    )
    return EarlyToken.start(config)


def test_a_failed_token_request_is_raised_by_wait_typed_and_without_the_secret() -> None:
    early = _early()
    with pytest.raises(CatalogUnavailableError, match="token endpoint") as failed:
        early.wait()
    assert SECRET not in str(failed.value)
    with pytest.raises(CatalogUnavailableError):
        early.wait()  # kept: the same error again
    early.session.close()


def test_it_never_pickles_and_its_repr_names_no_secret() -> None:
    early = _early()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(early)
    assert SECRET not in repr(early) and "wh" in repr(early)
    with pytest.raises(CatalogUnavailableError):
        early.wait()
    early.session.close()
