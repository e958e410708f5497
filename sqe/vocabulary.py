"""The Iceberg REST wire vocabulary, defined once for the engine, the scan workers and ``sqe-catalog``.

Only names and constants live here (no logic, no imports beyond the standard library), so every package can
depend on it without pulling in anything else. Location logic lives in :mod:`sqe.locations` (what a scheme
names: object store or local, aliases folded) and :mod:`sqe.credentials.paths` (segment-boundary prefix matching).
"""

from __future__ import annotations

from typing import Final

# ------------------------------------------------------------------------- FileIO / storage-credential keys
S3_ACCESS_KEY_ID: Final = "s3.access-key-id"
S3_SECRET_ACCESS_KEY: Final = "s3.secret-access-key"
S3_SESSION_TOKEN: Final = "s3.session-token"
S3_SESSION_TOKEN_EXPIRES_AT_MS: Final = "s3.session-token-expires-at-ms"  # read by SQE, never given to pyarrow
S3_ENDPOINT: Final = "s3.endpoint"
S3_REGION: Final = "s3.region"
S3_FORCE_VIRTUAL_ADDRESSING: Final = "s3.force-virtual-addressing"  # pyarrow's spelling of (not) path style
S3_PATH_STYLE_ACCESS: Final = "s3.path-style-access"  # Iceberg Java's spelling; the inverse of the above
S3_CONNECT_TIMEOUT: Final = "s3.connect-timeout"
S3_REQUEST_TIMEOUT: Final = "s3.request-timeout"
CLIENT_REGION: Final = "client.region"
CLIENT_REFRESH_CREDENTIALS_ENDPOINT: Final = "client.refresh-credentials-endpoint"

# ----------------------------------------------------------------------------------- load-table response
STORAGE_CREDENTIALS: Final = "storage-credentials"
READ_RESTRICTIONS: Final = "read-restrictions"
# Server-side scan planning: the most literals the set predicates (in, not-in) of one plan request's filter may
# list. Each costs the catalog microseconds to parse and bind (a million took 7 s of a core, forty times what other
# bytes of a body cost), so the catalog refuses more and the engine sends no filter rather than a longer one.
MAX_PLAN_FILTER_VALUES: Final = 10_000
# And the most predicates, and/or/not nodes included, such a filter may hold: each costs far more than a listed value
# (an or-tree of 200,000 equalities, 16 MB, took 34 s of a core; 1,000 take 0.07 s), so past this the catalog
# refuses the plan and the engine sends no filter.
MAX_PLAN_FILTER_PREDICATES: Final = 1_000
METADATA_LOCATION: Final = "metadata-location"

# ---------------------------------------------------------------------------------------------- headers
ACCESS_DELEGATION_HEADER: Final = "X-Iceberg-Access-Delegation"
VENDED_CREDENTIALS: Final = "vended-credentials"
VENDED_CREDENTIALS_LEGACY: Final = "true"  # Polaris's older spelling of the same request
CAPABILITIES_HEADER: Final = "X-Gravitino-Client-Capabilities"
READ_RESTRICTIONS_V1: Final = "read-restrictions.v1"

# --------------------------------------------------------------------------- OAuth 2.0 token exchange (RFC 8693)
TOKEN_EXCHANGE_GRANT: Final = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE: Final = "urn:ietf:params:oauth:token-type:access_token"

# ------------------------------------------------------------------------------------------- namespaces
# A multi-level namespace in a REST path joins its levels with the unit separator (0x1F), which cannot
# appear inside a level; "." can.
NAMESPACE_SEPARATOR: Final = "\x1f"

# ------------------------------------------------------------------------------------- object-store schemes
OBJECT_STORE_SCHEMES: Final = frozenset({"s3", "s3a", "s3n"})
FILE_SCHEME: Final = "file"
LOCAL_SCHEMES: Final = frozenset({FILE_SCHEME, ""})  # "": a bare path
SCHEME_ALIASES: Final = {"s3a": "s3", "s3n": "s3"}  # Hadoop's names for the same objects

# ------------------------------------------------------------------------------ ErrorModel "type" values
ERROR_BAD_REQUEST: Final = "BadRequestException"
ERROR_NOT_AUTHORIZED: Final = "NotAuthorizedException"
ERROR_FORBIDDEN: Final = "ForbiddenException"
ERROR_NOT_FOUND: Final = "NotFoundException"
ERROR_NO_SUCH_NAMESPACE: Final = "NoSuchNamespaceException"
ERROR_NO_SUCH_TABLE: Final = "NoSuchTableException"
ERROR_NO_SUCH_VIEW: Final = "NoSuchViewException"
ERROR_NO_SUCH_PRINCIPAL: Final = "NoSuchPrincipalException"
ERROR_NOT_ACCEPTABLE: Final = "NotAcceptableException"
ERROR_ALREADY_EXISTS: Final = "AlreadyExistsException"
ERROR_COMMIT_FAILED: Final = "CommitFailedException"
ERROR_UNPROCESSABLE: Final = "UnprocessableEntityException"
ERROR_SERVICE_UNAVAILABLE: Final = "ServiceUnavailableException"
ERROR_SERVER: Final = "ServerError"
# sqe-catalog's own types beside the spec's (the engine maps them by HTTP status)
ERROR_NAMESPACE_NOT_EMPTY: Final = "NamespaceNotEmptyException"
ERROR_METHOD_NOT_ALLOWED: Final = "MethodNotAllowedException"

# Iceberg table encryption (format-version >= 3): the table's master-key id property, the prefix of every
# encryption table property, the metadata list of wrapped keys, and a snapshot's manifest-list key reference.
ENCRYPTION_KEY_ID: Final = "encryption.key-id"
ENCRYPTION_PROPERTY_PREFIX: Final = "encryption."
ENCRYPTION_KEYS: Final = "encryption-keys"
SNAPSHOT_KEY_ID: Final = "key-id"
ERROR_METADATA_INTEGRITY: Final = "MetadataIntegrityException"

# ----------------------------------------------------------------------- sql-catalog: config and responses
# GET /v1/config `defaults` key naming the (URL-encoded) namespace separator of REST paths.
NAMESPACE_SEPARATOR_PROPERTY: Final = "namespace-separator"
# Response header carrying the id a 500's ErrorModel names (the catalog logs the failure under it).
REQUEST_ID_HEADER: Final = "X-Request-ID"
