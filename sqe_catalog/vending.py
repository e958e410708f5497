"""STS credential vending with Polaris-shaped inline session policies (CONTRACT STUB: to be implemented).

Public contract used by ``sqe_catalog.api``:

- ``session_policy(locations: Sequence[str], write: bool) -> str``: compact JSON (separators=(",", ":")).
- ``VendedCredential``: frozen dataclass (access_key_id, secret_access_key [repr=False],
  session_token [repr=False] | None, expires_at_ms: int | None); ``.to_config() -> dict[str, str]`` with
  s3.access-key-id, s3.secret-access-key, s3.session-token, s3.session-token-expires-at-ms (the last two only
  when present).
- ``CredentialVendor(warehouse: WarehouseConfig)``
    .vend(principal: str, table_key: str, locations: Sequence[str], write: bool) -> VendedCredential
        cached per (principal, table_key, write) while more than half the lifetime remains;
        sts_unavailable warehouses return the static key (no expiry);
        STS failures raise ServiceUnavailableError with a message that contains no secret.
    .assume_role_calls: int   (counter, for benchmarks and tests)
"""
