"""Sibling warehouses on another catalog inherit ``[catalog]``'s credentials only when they opt in.

Found by review: a ``[[catalog.warehouses]]`` entry whose ``uri`` names another catalog and that gives no identity
of its own inherited the end user's client secret or token (without a reader in ``[catalog]``), so whoever runs
that other catalog received them and could replay them at the primary catalog. The reader case is in
``test_config_reader.py``; the catalog clients' side (no request at all) in ``catalog/test_sibling_credentials.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sqe.config import CatalogConfig, SiblingWarehouseConfig, SQEConfig, load_config, same_origin
from sqe.errors import ConfigError

SECRET = "PRIMARY-SECRET-4d1"
PRIMARY = "http://127.0.0.1:8181/api/catalog"
OTHER = "http://other.example:8182/api/catalog"
BASE = {"catalog.uri": PRIMARY, "catalog.warehouse": "demo"}
IDENTITIES = {
    "client credentials": ({"catalog.client_id": "alice", "catalog.client_secret": SECRET}, "catalog.client_secret"),
    "token": ({"catalog.token": SECRET}, "catalog.token"),
}


def _load(identity: dict[str, Any], siblings: list[dict[str, Any]]) -> SQEConfig:
    return load_config(env={}, overrides={**BASE, **identity, "catalog.warehouses": siblings})


def _refused(call: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        call()
    message = str(caught.value)
    assert SECRET not in message and "\n" not in message
    return message


def _names_the_uri_and_both_ways_out(message: str, sent: str) -> None:
    assert message.startswith("catalog.warehouses[0].uri"), message
    assert '"http://other.example:8182" is another catalog than catalog.uri' in message
    assert f"would receive [catalog]'s credentials ({sent})" in message
    assert "catalog.warehouses[0].client_id/client_secret or catalog.warehouses[0].token" in message
    assert "catalog.warehouses[0].inherit_credentials = true" in message


@pytest.mark.parametrize("identity", IDENTITIES)
def test_a_sibling_on_another_catalog_without_its_own_identity_is_refused(identity: str) -> None:
    settings, sent = IDENTITIES[identity]
    message = _refused(lambda: _load(settings, [{"name": "other", "uri": OTHER}]))
    _names_the_uri_and_both_ways_out(message, sent)


def test_the_refusal_names_the_file_or_the_variable_that_set_the_sibling(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[catalog]\nuri = "{PRIMARY}"\nwarehouse = "demo"\nclient_id = "alice"\nclient_secret = "{SECRET}"\n'
        f'[[catalog.warehouses]]\nname = "other"\nuri = "{OTHER}"\n'
    )
    path.chmod(0o600)
    _names_the_uri_and_both_ways_out(_refused(lambda: load_config(path, env={})), "catalog.client_secret")
    env = {"SQE_CATALOG__WAREHOUSES": f'[{{"name": "other", "uri": "{OTHER}"}}]'}
    message = _refused(lambda: load_config(path, env=env))
    assert message.startswith("catalog.warehouses[0].uri (set by SQE_CATALOG__WAREHOUSES): ")
    _names_the_uri_and_both_ways_out(message, "catalog.client_secret")
    opted_in = {"SQE_CATALOG__WAREHOUSES": f'[{{"name": "other", "uri": "{OTHER}", "inherit_credentials": true}}]'}
    assert load_config(path, env=opted_in).catalog.connection("other").client_secret_value() == SECRET


def test_the_uri_shown_is_its_origin_only() -> None:
    """The path, a query (which may carry a token) and anything else past the origin stay out of the message."""
    uri = "http://Other.Example:8182/api/catalog?token=QUERY-TOKEN-e1"
    message = _refused(lambda: _load(IDENTITIES["token"][0], [{"name": "other", "uri": uri}]))
    assert '"http://Other.Example:8182" is another catalog' in message and "QUERY-TOKEN" not in message


@pytest.mark.parametrize("identity", IDENTITIES)
def test_opting_in_sends_the_end_users_credentials_there(identity: str) -> None:
    settings, _sent = IDENTITIES[identity]
    config = _load(settings, [{"name": "other", "uri": OTHER, "inherit_credentials": True}])
    connection = config.catalog.connection("other")
    assert connection.uri == OTHER
    assert SECRET in (connection.client_secret_value(), connection.token_value())


def test_siblings_on_the_same_catalog_inherit_as_before() -> None:
    same = [PRIMARY + "/", "HTTP://127.0.0.1:8181/api/catalog", None]
    siblings = [{"name": f"same{i}", **({"uri": uri} if uri else {})} for i, uri in enumerate(same)]
    config = _load(IDENTITIES["client credentials"][0], siblings)
    for i in range(len(same)):
        connection = config.catalog.connection(f"same{i}")
        assert (connection.client_id, connection.client_secret_value()) == ("alice", SECRET)


def test_a_sibling_with_its_own_identity_or_nothing_to_inherit_needs_no_opt_in() -> None:
    own = {"name": "other", "uri": OTHER, "token": "SIBLING-TOKEN"}
    config = _load(IDENTITIES["client credentials"][0], [own])
    assert config.catalog.connection("other").token_value() == "SIBLING-TOKEN"
    # [catalog] without credentials (sqe serve's engine config: users bring their tokens) sends nothing anywhere
    bare = _load({}, [{"name": "other", "uri": OTHER}]).catalog.connection("other")
    assert not bare.sets_auth


def test_opting_in_and_bringing_its_own_credentials_is_refused() -> None:
    both = {"name": "other", "uri": OTHER, "token": "SIBLING-TOKEN", "inherit_credentials": True}
    message = _refused(lambda: _load(IDENTITIES["client credentials"][0], [both]))
    assert message.startswith("catalog.warehouses[0].inherit_credentials")
    assert "not both" in message


def test_a_config_built_in_code_is_held_to_the_same_rule() -> None:
    """``sqe.api.connect`` takes an ``SQEConfig`` object as it is (no ``load_config``): every catalog client gets
    its connection through ``CatalogConfig.connection``, which applies the rule too."""
    catalog = CatalogConfig(
        uri=PRIMARY,
        warehouse="demo",
        client_id="alice",
        client_secret=SECRET,
        warehouses=(SiblingWarehouseConfig(name="other", uri=OTHER),),
    )
    _names_the_uri_and_both_ways_out(_refused(lambda: catalog.connection("other")), "catalog.client_secret")
    assert catalog.connection().client_secret_value() == SECRET  # the primary itself is untouched
    opted_in = catalog.model_copy(
        update={"warehouses": (SiblingWarehouseConfig(name="other", uri=OTHER, inherit_credentials=True),)}
    )
    assert opted_in.connection("other").client_secret_value() == SECRET
    # a uri urlsplit cannot read is no catalog the primary is: refused the same way, never a bare ValueError
    unreadable = catalog.model_copy(
        update={"warehouses": (SiblingWarehouseConfig(name="other", uri="http://u:pw@[x/y?token=t"),)}
    )
    message = _refused(lambda: unreadable.connection("other"))
    assert message.startswith('catalog.warehouses[0].uri: "http://[x" is another catalog than catalog.uri')


def test_a_sibling_uri_requests_reads_as_another_host_is_another_catalog() -> None:
    """Found by review: urlsplit reads ``http://evil\\@127.0.0.1:8181/...`` as host 127.0.0.1 (the primary's), while
    requests (urllib3) sends it to host ``evil``: a sibling built in code with that uri and no identity inherited the
    primary's client secret, and its token request went to ``evil``. Now a backslash in the host part is no
    catalog endpoint (never the same catalog) and a ConfigError in a file."""
    sneaky = "http://evil.example\\@127.0.0.1:8181/api/catalog"
    catalog = CatalogConfig(
        uri=PRIMARY,
        warehouse="demo",
        client_id="alice",
        client_secret=SECRET,
        warehouses=(SiblingWarehouseConfig(name="other", uri=sneaky),),
    )
    message = _refused(lambda: catalog.connection("other"))
    assert message.startswith('catalog.warehouses[0].uri: "http://evil.example" is another catalog'), message
    with pytest.raises(ConfigError, match=r"catalog\.warehouses\[0\]\.uri .*must not hold a backslash"):
        _load(IDENTITIES["token"][0], [{"name": "other", "uri": "http://evil.example\\.127.0.0.1:8181/"}])


@pytest.mark.parametrize(
    ("uri", "other", "same"),
    [
        ("http://cat:8181/api/catalog", "HTTP://CAT:8181/other/", True),  # another path on that origin
        ("https://cat/api", "https://cat:443", True),  # the default port written out
        ("http://cat:8181", "http://cat:8182", False),
        ("http://cat:8181", "https://cat:8181", False),
        ("http://cat", "http://cat.evil", False),
        ("http://cat", "http://[::1", False),  # an override urlsplit cannot read is no origin
        ("http://127.0.0.1:8181", "http://evil\\@127.0.0.1:8181", False),  # requests' host: evil
    ],
)
def test_same_origin_is_scheme_host_and_port(uri: str, other: str, same: bool) -> None:
    """The origin a catalog's ``/v1/config`` override of ``uri`` must keep (``SQERestCatalog._fetch_config``)."""
    assert same_origin(uri, other) is same and same_origin(other, uri) is same
