"""Connections that acknowledge a response's first segment at once, so a Nagle-bound store cannot stall a read.

A store that writes a response's status line and headers in one ``send`` and a small body in another, with
Nagle's algorithm on (Ceph RGW's beast front end does, unless it runs with ``tcp_nodelay=1``), holds the body
back until the headers are acknowledged. Linux delays that acknowledgement by up to 40 ms on a kept-alive
connection, so every small GET (a manifest, a manifest list, a footer) took 44 ms against such an RGW instead of
about 3 ms. Asking for a quick acknowledgement (``TCP_QUICKACK``) just before reading each response removes the
wait; the option is not sticky, which is why it is set per response. Where the platform has no such option,
the connections behave as urllib3's own.

Imported by :mod:`sqe.credentials.signed_reads` when it builds its pool (urllib3 is imported lazily there).
"""

from __future__ import annotations

import socket

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.response import HTTPResponse

__all__ = ["POOL_CLASSES"]

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only


def _acknowledge_promptly(sock: socket.socket | None) -> None:
    if sock is None or _QUICKACK is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
    except OSError:  # not a TCP socket, or already closed: the read reports what matters
        return


class _QuickAckHTTPConnection(HTTPConnection):
    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3 declares it
        _acknowledge_promptly(self.sock)
        return super().getresponse()


class _QuickAckHTTPSConnection(HTTPSConnection):
    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3 declares it
        _acknowledge_promptly(self.sock)
        return super().getresponse()


class _QuickAckHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _QuickAckHTTPConnection


class _QuickAckHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _QuickAckHTTPSConnection


# For ``PoolManager.pool_classes_by_scheme``.
POOL_CLASSES: dict[str, type[HTTPConnectionPool]] = {
    "http": _QuickAckHTTPConnectionPool,
    "https": _QuickAckHTTPSConnectionPool,
}
