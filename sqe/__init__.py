"""SQE: credential-aware SQL over Apache Iceberg tables served by an Iceberg REST catalog."""

from sqe.errors import (
    AuthenticationError,
    CatalogError,
    ConfigError,
    CredentialError,
    CredentialExpiredError,
    NoVendedCredentialsError,
    PermissionDeniedError,
    QueryError,
    RestrictionError,
    SQEError,
)

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "CatalogError",
    "ConfigError",
    "CredentialError",
    "CredentialExpiredError",
    "NoVendedCredentialsError",
    "PermissionDeniedError",
    "QueryError",
    "RestrictionError",
    "SQEError",
    "__version__",
]
