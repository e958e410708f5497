"""SQE errors as Flight status codes, with SQE's one-line typed message and never a secret or a traceback.

pyarrow's Flight server turns any exception that is not a ``FlightError`` into a status whose details carry the
Python traceback, so every handler error leaves through :func:`to_flight`. The codes pyarrow can send:

=============================================  =====================  ===========================================
SQE error                                      Flight status          note
=============================================  =====================  ===========================================
AuthenticationError                            UNAUTHENTICATED        bad, expired, revoked or foreign token
PermissionDeniedError, RestrictionsNotSupp.    PERMISSION_DENIED
ServerBusyError                                UNAVAILABLE            "server busy: ..." (pyarrow has no
                                                                      RESOURCE_EXHAUSTED); retry later
CatalogUnavailableError                        UNAVAILABLE
QueryTimeoutError                              DEADLINE_EXCEEDED
QueryCancelledError                            CANCELLED
any other SQEError                             UNKNOWN ("Failed")     ``TypeName: message``
anything else                                  INTERNAL               "internal error" (details in the log)
=============================================  =====================  ===========================================
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pyarrow.flight as flight

from sqe._text import first_line, without_secrets
from sqe.errors import (
    AuthenticationError,
    CatalogUnavailableError,
    PermissionDeniedError,
    RestrictionsNotSupportedError,
    SQEError,
)
from sqe.execution.local import QueryCancelledError
from sqe.server.sessions import QueryTimeoutError, ServerBusyError

log = logging.getLogger(__name__)
_MAX_MESSAGE = 500


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every known secret replaced, also encoded or cut short (defence in depth: SQE's messages carry
    none). Secrets shorter than 6 characters are left: blanking them would blank ordinary words."""
    return without_secrets(text, [secret for secret in secrets if len(secret) >= 6])


def to_flight(exc: BaseException, secrets: Iterable[str] = ()) -> flight.FlightError:
    """The Flight error a client sees for ``exc``: one line, typed, redacted."""
    if isinstance(exc, flight.FlightError):
        return exc
    if not isinstance(exc, SQEError):
        log.error("internal error: %s", type(exc).__name__)
        return flight.FlightInternalError("internal error in sqe serve (see the server log)")
    message = first_line(redact(first_line(exc), list(secrets)), limit=_MAX_MESSAGE)  # cut after: no head left
    typed = f"{type(exc).__name__}: {message}"
    if isinstance(exc, AuthenticationError):
        return flight.FlightUnauthenticatedError(typed)
    if isinstance(exc, PermissionDeniedError | RestrictionsNotSupportedError):
        return flight.FlightUnauthorizedError(typed)
    if isinstance(exc, ServerBusyError | CatalogUnavailableError):
        return flight.FlightUnavailableError(typed)
    if isinstance(exc, QueryTimeoutError):
        return flight.FlightTimedOutError(typed)
    if isinstance(exc, QueryCancelledError):
        return flight.FlightCancelledError(typed)
    return flight.FlightServerError(typed)
