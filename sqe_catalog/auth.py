"""Principals, OAuth client-credentials tokens and grants (CONTRACT STUB: to be implemented).

Public contract used by ``sqe_catalog.api``:

- ``Privilege``: str enum with at least CATALOG_MANAGE_CONTENT, CATALOG_MANAGE_ACCESS, NAMESPACE_CREATE,
  NAMESPACE_LIST, NAMESPACE_READ_PROPERTIES, NAMESPACE_WRITE_PROPERTIES, NAMESPACE_DROP,
  NAMESPACE_FULL_METADATA, TABLE_CREATE, TABLE_LIST, TABLE_READ_PROPERTIES, TABLE_WRITE_PROPERTIES,
  TABLE_DROP, TABLE_READ_DATA, TABLE_WRITE_DATA, TABLE_FULL_METADATA.
- ``Principal``: frozen dataclass (name, client_id, roles: frozenset[str], groups: frozenset[str],
  is_admin: bool). Its repr never includes a secret.
- ``AuthStore(engine: sqlalchemy.Engine, signing_key: bytes, token_lifetime_seconds: int)``
    .create_schema() -> None
    .issue_token(client_id: str, client_secret: str, scope: str) -> tuple[str, int]  # (token, expires_in)
        raises NotAuthorizedError (bad id/secret), BadRequestError (bad scope)
    .principal_for_token(token: str) -> Principal                                     # NotAuthorizedError
    .has_privilege(p: Principal, privilege: Privilege, warehouse: str, namespace: tuple[str, ...] | None,
                   table: str | None = None) -> bool
    .require(p, privilege, warehouse, namespace=None, table=None) -> None             # ForbiddenError
"""
