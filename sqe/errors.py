"""SQE's single exception tree. Every message is one clear line and never contains a secret.

SQEError
├── ConfigError                       bad config file, env override, unknown key, wrong type
├── CatalogError                      anything the REST catalog said or failed to say
│   ├── AuthenticationError (401)
│   ├── PermissionDeniedError (403)
│   ├── NoSuchTableError (404)
│   │   └── NoSuchViewError (404)
│   ├── NoSuchNamespaceError (404)
│   ├── RestrictionsNotSupportedError (406)
│   ├── IntegrityError (422, never retried)
│   ├── CommitConflictError (409)
│   ├── CommitStateUnknownError       a commit was sent, no answer says whether it landed (5xx, lost answer)
│   ├── CatalogUnavailableError (429/5xx/connection after retries)
│   ├── CatalogProtocolError (malformed response)
│   └── RemotePlanningError           server-side scan planning switched on, not offered or failed
├── CredentialError
│   ├── NoVendedCredentialsError      require_vended_credentials and the catalog vended nothing
│   └── CredentialExpiredError
├── RestrictionError                  read-restrictions that cannot be applied (fail closed)
├── QueryError                        SQL the engine cannot run (syntax, unknown table, ...)
│   ├── EncryptedTableError           Iceberg table encryption (encryption.key-id / encryption-keys)
│   ├── RestrictedTableError          DML or metadata tables on a table the caller reads with restrictions
│   ├── ManifestLimitError            a manifest list or manifest past a read limit (sqe.planning.avro_limits)
│   ├── DeleteFileLimitError          a position delete file or deletion vector past a read limit (delete_limits)
│   ├── QueryResourceError            the query needs more memory or spill space than its database may take
│   ├── DataFileError                 a data file yielding other rows than its footer or manifest entry states
│   └── UnsupportedViewDialectError   a view with no SQL representation SQE can run
└── WorkerError                       distributed execution failures
"""

from __future__ import annotations

from sqe._text import redacted_message


class SQEError(Exception):
    """Base class of every error SQE raises on purpose.

    A message may quote a location a user or a catalog named (a table function's URL, DuckDB's own error text
    about one), which may carry a password or a presigned signature: every string argument is taken through
    :func:`redacted_message` here, once for every error, so ``str``, ``repr`` and pickles never hold one (and a
    message quoting megabytes is cut to ``MAX_MESSAGE_CHARS`` first, so building it costs a bounded time)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redacted_message(arg) if isinstance(arg, str) else arg for arg in args))


class ConfigError(SQEError):
    pass


class CatalogError(SQEError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AuthenticationError(CatalogError):
    pass


class PermissionDeniedError(CatalogError):
    pass


class NoSuchTableError(CatalogError):
    pass


class NoSuchNamespaceError(CatalogError):
    pass


class RestrictionsNotSupportedError(CatalogError):
    pass


class IntegrityError(CatalogError):
    pass


class CommitConflictError(CatalogError):
    pass


class CatalogUnavailableError(CatalogError):
    pass


class CommitStateUnknownError(CatalogError):
    """A commit reached the catalog (or may have) and its outcome is unknown: it may have landed. Not a
    ``CatalogUnavailableError``: nothing may retry it blindly (the rows would be written twice)."""


class CatalogProtocolError(CatalogError):
    pass


class CredentialError(SQEError):
    pass


class NoVendedCredentialsError(CredentialError):
    pass


class CredentialExpiredError(CredentialError):
    pass


class RestrictionError(SQEError):
    pass


class QueryError(SQEError):
    pass


class EncryptedTableError(QueryError):
    """The table uses Iceberg encryption; SQE refuses it before reading any file (never garbage)."""


class RestrictedTableError(QueryError):
    """The caller reads the table through read-restrictions, so SQE refuses to write it or show its metadata."""


class ManifestLimitError(QueryError):
    """A table's manifest list or manifest that planning will not read: larger than a limit stored or inflated,
    or not an Avro container file. The table's own files: no retry changes that."""


class DeleteFileLimitError(QueryError):
    """A table's position delete file or deletion vector that a scan will not read whole: more rows or bytes
    than a limit, a vector naming a row past its data file, or a Puffin file that holds no deletion vectors."""


class QueryResourceError(QueryError):
    """DuckDB ran out of the memory or spill space its database may take (``sqe serve``: ``[server]
    engine_memory_bytes`` / ``engine_spill_bytes``; a worker's partial aggregate: ``sqe-worker
    --aggregate-memory-bytes`` / ``--aggregate-spill-bytes``): the same query fails again under the same limits."""


class StatementNotPreparableError(QueryError):
    """Only a query or an INSERT can be prepared (``Session.prepare``, SQL ``PREPARE``). ``sqe serve``'s prepare
    takes this type, never an error's text, for a statement it runs as a plain statement at execution: a client
    that prepares every statement (ADBC, JDBC) runs DDL and SQE's own statements so."""


class DataFileError(QueryError):
    """A table's Parquet data file whose footer disagrees with itself or with its manifest entry, or whose row
    group yields other rows than it states (``sqe.execution.file_rows``). The table's own file: no retry, on this
    worker or another, changes that."""


class ExternalAccessError(QueryError):
    """A file table function or external table may not read this path (outside the allowed prefixes, inside a
    governed table's location, or a local path that is not allowed)."""


class CompactionConflictError(CommitConflictError):
    """A concurrent commit removed a file OPTIMIZE was rewriting; its outputs were deleted, nothing committed."""


class WorkerError(SQEError):
    pass


# ----------------------------------------------------------------------------------------------------
# Read-restriction errors (raised by sqe.restrictions). Each is a RestrictionError, so callers that only
# care that a restriction could not be applied catch the base class; the query then fails with no rows.
# ----------------------------------------------------------------------------------------------------


class InvalidRestrictionError(RestrictionError):
    """The read-restrictions object is malformed or does not fit the table schema."""


class UnsupportedRestrictionError(RestrictionError):
    """A well-formed restriction this reader cannot apply (unknown action/expression, function, nested)."""


class RestrictionApplyError(RestrictionError):
    """A validated plan could not be applied to a batch (missing filter column, bad salt, odd Arrow type)."""


class NoSuchViewError(NoSuchTableError):
    """An unknown view (a NoSuchTableError, so ``DROP VIEW IF EXISTS`` and name lookups treat both alike)."""


class UnsupportedViewDialectError(QueryError):
    """A view has no SQL representation SQE can run (duckdb, or spark/trino SQL that DuckDB parses)."""


class RemotePlanningError(CatalogError):
    """Server-side scan planning is switched on but the catalog cannot or did not plan the scan."""
