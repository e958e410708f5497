"""``sqe serve``'s IdentityBroker against the real ``sqe-catalog``: the reader's own token and the exchange.

The broker runs in this process (it is what the server runs per call); the catalog, its token endpoint and its
RFC 8693 exchange are the session's real catalog process.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
import requests

from sqe.server.identity import IdentityBroker

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e


def _broker(server: CatalogServer, reader: CatalogPrincipal, scope: str) -> IdentityBroker:
    return IdentityBroker(
        server.url,
        server.warehouse,
        scope=scope,
        reader_client_id=reader.client_id,
        reader_client_secret=reader.client_secret,
    )


def test_a_scope_naming_the_users_role_narrows_the_user_and_never_the_reader(
    catalog_server: CatalogServer, catalog_reader: CatalogPrincipal
) -> None:
    """``[catalog] scope`` names roles of the end users (their Basic logins get it); the reader holds none of them,
    so its own token asking for that scope was refused and no user could be served at all."""
    suffix = uuid.uuid4().hex[:6]
    scoped, unscoped = f"broker_scoped_{suffix}", f"broker_unscoped_{suffix}"
    listing = [("NAMESPACE_LIST", None, None)]
    user = catalog_server.create_principal(f"broker_user_{suffix}", role=scoped, grants=listing)
    catalog_server.create_principal(f"broker_other_{suffix}", role=unscoped, grants=listing)  # makes the role
    catalog_server.admin_cli("assign-role", user.name, unscoped)
    broker = _broker(catalog_server, catalog_reader, f"PRINCIPAL_ROLE:{scoped}")
    try:
        signed_in = broker.authenticate_basic(user.client_id, user.client_secret)
        delegated = broker.catalog_token(signed_in)
        catalog_server.secrets.update({signed_in.token, delegated})
        namespaces = requests.get(
            f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces",
            headers={"Authorization": f"Bearer {delegated}"},
            timeout=30,
        )
        assert namespaces.status_code == 200, namespaces.text
        # The delegated token carries the user's narrowed roles: the role left out of the scope stays out.
        catalog_server.admin_cli("unassign-role", user.name, scoped)
        narrowed = requests.get(
            f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces",
            headers={"Authorization": f"Bearer {delegated}"},
            timeout=30,
        )
        assert narrowed.status_code == 403, "the other role the user holds is not in the delegated token"
    finally:
        broker.close()
