"""The trusted-reader identity in ``[catalog]``: validation, inheritance, secrets."""

from __future__ import annotations

import hashlib
import pickle

import pytest

from sqe._text import short_identity
from sqe.catalog.rest import principal_key
from sqe.config import CatalogConnection, SQEConfig, load_config
from sqe.errors import ConfigError

BASE = {"catalog.uri": "http://127.0.0.1:1", "catalog.warehouse": "demo"}


def _load(**overrides: object) -> object:
    return load_config(env={}, overrides={**BASE, **overrides})


def test_reader_with_end_user_is_accepted_and_its_secret_stays_hidden() -> None:
    config = load_config(
        env={"SQE_CATALOG__READER_CLIENT_SECRET": "reader-secret-value"},
        overrides={
            **BASE,
            "catalog.client_id": "analyst",
            "catalog.client_secret": "user-secret-value",
            "catalog.reader_client_id": "sqe-engine",
        },
    )
    connection = config.catalog.connection()
    assert connection.delegates and connection.reader_client_id == "sqe-engine"
    assert connection.reader_client_secret_value() == "reader-secret-value"
    assert "reader-secret-value" not in repr(config) + repr(connection)
    with pytest.raises(TypeError):
        pickle.dumps(connection)
    # the cache key separates the user's own identity from the user acting through a reader
    assert principal_key(connection) == "client:analyst+reader:sqe-engine"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"catalog.client_id": "a", "catalog.client_secret": "s", "catalog.reader_client_id": "r"},
            "catalog.reader_client_secret: required when catalog.reader_client_id is set",
        ),
        (
            {"catalog.client_id": "a", "catalog.client_secret": "s", "catalog.reader_client_secret": "x"},
            "catalog.reader_client_id: required when catalog.reader_client_secret is set",
        ),
        (
            {"catalog.reader_client_id": "r", "catalog.reader_client_secret": "x"},
            "catalog.reader_client_id: a reader acts for an end user",
        ),
    ],
)
def test_incomplete_reader_settings_name_the_key(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(**overrides)
    key, _, text = message.partition(": ")
    assert str(caught.value).startswith(key) and text in str(caught.value)


def test_sibling_inherits_the_reader_unless_it_brings_its_own_identity() -> None:
    config = load_config(
        env={},
        overrides={
            **BASE,
            "catalog.client_id": "analyst",
            "catalog.client_secret": "s",
            "catalog.reader_client_id": "sqe-engine",
            "catalog.reader_client_secret": "r",
            "catalog.warehouses": [{"name": "same"}, {"name": "own", "client_id": "bob", "client_secret": "b"}],
        },
    )
    assert config.catalog.connection("same").reader_client_id == "sqe-engine"
    assert not config.catalog.connection("own").delegates  # own credentials are never mixed with [catalog]'s


def test_sibling_reader_needs_its_own_end_user() -> None:
    with pytest.raises(ConfigError) as caught:
        _load(
            **{
                "catalog.client_id": "analyst",
                "catalog.client_secret": "s",
                "catalog.warehouses": [{"name": "w2", "reader_client_id": "r", "reader_client_secret": "x"}],
            }
        )
    assert str(caught.value).startswith("catalog.warehouses[0].reader_client_id")
    assert "a reader acts for an end user" in str(caught.value)


def test_a_principal_known_only_by_its_token_is_keyed_by_the_tokens_whole_digest() -> None:
    """Found by review: it was keyed by 16 hex digits (64 bits), so two tokens sharing them would have shared cached
    tables and credential leases. Logs show the key through ``short_identity``: 16 hex digits, never the token."""
    token = "opaque-catalog-token-51c2"
    key = principal_key(_connection(token))
    assert key == "token:" + hashlib.sha256(token.encode()).hexdigest()
    assert short_identity(key) == "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    assert principal_key(_connection(token + "x")) != key


def _connection(token: str) -> CatalogConnection:
    config = load_config(env={}, overrides={**BASE, "catalog.token": token})
    assert isinstance(config, SQEConfig)
    return config.catalog.connection()


def test_a_sibling_on_another_catalog_never_inherits_the_reader() -> None:
    """Found by review: a sibling warehouse with its own ``uri`` and no identity of its own inherited all of
    ``[catalog]``'s, the reader's client secret included, and sent it to that other catalog's token endpoint:
    whoever runs it could then exchange any user's token it also sees for raw credentials of restricted tables."""
    reader = {"catalog.client_id": "analyst", "catalog.client_secret": "s"}
    reader |= {"catalog.reader_client_id": "sqe-engine", "catalog.reader_client_secret": "r"}
    other = {"name": "other", "uri": "http://127.0.0.1:2"}
    with pytest.raises(ConfigError) as caught:
        _load(**reader, **{"catalog.warehouses": [{"name": "same", "uri": "http://127.0.0.1:1/"}, other]})
    assert str(caught.value).startswith("catalog.warehouses[1].uri")
    assert "is another catalog than catalog.uri, which would receive the reader's secret" in str(caught.value)
    # Opting in to inherit [catalog]'s credentials there never covers the reader's.
    with pytest.raises(ConfigError, match=r"^catalog\.warehouses\[0\]\.uri .*never sends the reader's$"):
        _load(**reader, **{"catalog.warehouses": [{**other, "inherit_credentials": True}]})
    # Its own identity (a reader of that catalog too, when it needs one) is fine; so is [catalog] without a reader
    # when the sibling opts in to its end-user credentials (see test_config_siblings.py).
    own = {**other, "client_id": "bob", "client_secret": "b", "reader_client_id": "e2", "reader_client_secret": "x"}
    config = load_config(env={}, overrides={**BASE, **reader, "catalog.warehouses": [own]})
    assert isinstance(config, SQEConfig) and config.catalog.connection("other").reader_client_id == "e2"
    opted_in = [{**other, "inherit_credentials": True}]
    plain = load_config(env={}, overrides={**BASE, "catalog.token": "t", "catalog.warehouses": opted_in})
    assert isinstance(plain, SQEConfig) and not plain.catalog.connection("other").delegates


def test_a_sibling_naming_the_same_catalog_in_other_spelling_keeps_the_reader() -> None:
    """Found by review: the check compared the URIs as written, trailing slashes aside, so a sibling naming the
    primary catalog with its scheme or host in other case, or its default port written out, was refused as
    "another catalog" (and left out of sqe serve's user sessions), though HTTP reads both as one endpoint. Another
    port, host or path is still another catalog."""
    reader = {"catalog.client_id": "analyst", "catalog.client_secret": "s"}
    reader |= {"catalog.reader_client_id": "sqe-engine", "catalog.reader_client_secret": "r"}
    primary = {"catalog.uri": "http://catalog.example:80/api/catalog"}
    same = ["HTTP://Catalog.Example/api/catalog/", "http://CATALOG.example:80/api/catalog//"]
    siblings = [{"name": f"same{i}", "uri": uri} for i, uri in enumerate(same)]
    config = load_config(env={}, overrides={**BASE, **primary, **reader, "catalog.warehouses": siblings})
    assert isinstance(config, SQEConfig)
    assert all(config.catalog.connection(f"same{i}").reader_client_id == "sqe-engine" for i in range(len(same)))
    others = ["http://catalog.example:8080/api/catalog", "http://catalog2.example/api/catalog"]
    others += ["http://catalog.example/api/Catalog", "https://catalog.example/api/catalog"]
    for uri in others:
        with pytest.raises(ConfigError, match=r"^catalog\.warehouses\[0\]\.uri"):
            _load(**primary, **reader, **{"catalog.warehouses": [{"name": "other", "uri": uri}]})
