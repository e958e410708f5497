"""Bearer-token authentication for every RPC, checked before the request is even deserialised.

A call without ``authorization: Bearer <token>`` equal to the worker's token is refused with UNAUTHENTICATED and a
fixed message, so an unauthenticated caller learns nothing about fragments or credentials.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import grpc

from sqe.errors import ConfigError

MIN_TOKEN_LENGTH = 16
_DENIED = "missing or invalid bearer token"


def read_token_file(path: Path) -> str:
    """The token (surrounding whitespace removed); an unreadable, empty or short token is a ConfigError."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the token file {path}: {type(exc).__name__}") from None
    if len(token) < MIN_TOKEN_LENGTH or any(ch.isspace() for ch in token):
        raise ConfigError(
            f"the token file {path} must hold one token of at least {MIN_TOKEN_LENGTH} characters without spaces"
        )
    return token


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class BearerTokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc ships no type information
    def __init__(self, token: str) -> None:
        self._expected = _digest(f"Bearer {token}")

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        values = [value for key, value in handler_call_details.invocation_metadata or () if key == "authorization"]
        presented = values[0] if len(values) == 1 and isinstance(values[0], str) else ""
        # Compare fixed-length digests in constant time: neither content nor length leaks through timing.
        if hmac.compare_digest(_digest(presented), self._expected):
            return continuation(handler_call_details)
        return _denying_handler(continuation(handler_call_details))


def _deny(request: Any, context: grpc.ServicerContext) -> NoReturn:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)
    raise AssertionError("grpc context.abort returned")


def _denying_handler(real: Any) -> Any:
    """A handler that only aborts, declared request-streaming whatever the real method is: gRPC then calls it at
    once, with an iterator it never reads, so the request bytes are never deserialised, and no server thread waits
    for a request message. A unary handler would hold a server thread until the client sends its message, so a
    few unauthenticated calls that never send one would starve every RPC (control calls included)."""
    if real is not None and real.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_deny)
    return grpc.stream_unary_rpc_method_handler(_deny)
