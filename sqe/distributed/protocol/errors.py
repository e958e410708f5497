"""Worker errors and how they reach the coordinator: a gRPC status plus a machine-readable ``sqe-error-kind``.

Every error message is one line naming paths, prefixes, fragment ids or times, never a key, secret or token.
"""

from __future__ import annotations

from sqe.errors import CredentialError, WorkerError

ERROR_KIND_KEY = "sqe-error-kind"  # trailing metadata key on a failed Execute stream

KIND_INVALID_TICKET = "invalid-ticket"
KIND_DUPLICATE_FRAGMENT = "duplicate-fragment"
KIND_CREDENTIAL_EXPIRED = "credential-expired"
KIND_NO_CREDENTIALS = "no-credentials"
KIND_RESTRICTION = "restriction"
KIND_CANCELLED = "cancelled"
KIND_READ_FAILED = "read-failed"
KIND_MESSAGE_TOO_LARGE = "message-too-large"
KIND_BUSY = "busy"
KIND_INTERNAL = "internal"
KIND_DATA_FILE = "data-file"  # a data file disagreeing with its footer or manifest entry: no retry changes it
# a partial aggregate past its database's memory or spill limits on the worker: QueryResourceError
KIND_RESOURCE_LIMIT = "resource-limit"
KIND_OUTPUT_NOT_ALLOWED = "output-not-allowed"  # a rewrite tried to write a path its ticket does not name


class InvalidTicketError(WorkerError):
    """The ticket is malformed or asks for something the worker cannot do."""


class DuplicateFragmentError(WorkerError):
    """A fragment with this id is already running on this worker."""


class WorkerBusyError(WorkerError):
    """The worker already runs its maximum number of fragments."""


class InvalidBatchError(WorkerError):
    """A batch message that is not a well-formed Arrow batch of its stream's schema (never read further)."""


class MessageTooLargeError(WorkerError):
    """A single row does not fit in one gRPC message."""


class MissingCredentialsError(CredentialError):
    """No credential set of the ticket covers a file's path (ambient credentials are never used instead)."""
