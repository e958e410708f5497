"""Flight call options for tests whose repr hides the headers: pytest prints the arguments of every frame in a
failure's traceback (``options = ...``), and pyarrow's repr of call options shows their bearer token."""

from __future__ import annotations

import pyarrow.flight as flight


class CallOptions(flight.FlightCallOptions):
    def __repr__(self) -> str:
        return "<FlightCallOptions headers hidden>"


def bearer(token: str, *headers: tuple[bytes, bytes], timeout: float | None = None) -> CallOptions:
    """Options sending ``token`` as ``Authorization: Bearer``, then ``headers``."""
    return CallOptions(headers=[(b"authorization", f"Bearer {token}".encode()), *headers], timeout=timeout)
