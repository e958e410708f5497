"""Which client connections of this process are still open: the peers of its established TCP sockets.

Flight (gRPC) tells a handler nothing when a client closes its connection, so a client session keyed by its
connection (a client without cookies) would otherwise keep its engine sessions — DuckDB connection, worker
channels and their threads and descriptors — until ``idle_session_seconds``. On Linux the process's own sockets
are its ``/proc/self/fd`` entries, and ``/proc/net/tcp{,6}`` says which of them are established and with whom;
:func:`connected_peers` answers the set of those remote endpoints, or ``None`` where that cannot be known (then
nothing is treated as gone).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import unquote

Endpoint = tuple[str, int]  # (canonical IP text, port)

_ESTABLISHED = "01"
_PROC_NET = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_SOCKET_PREFIX = "socket:["


def parse_peer(peer: str) -> Endpoint | None:
    """A gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, maybe %-encoded) as an endpoint."""
    text = unquote(peer)
    for prefix in ("ipv4:", "ipv6:"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    else:
        return None
    host, _, port = text.rpartition(":")
    try:
        return _canonical(ipaddress.ip_address(host.strip("[]"))), int(port)
    except ValueError:
        return None


def _canonical(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """IPv4-mapped IPv6 addresses as their IPv4 text, so both socket families compare alike."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _hex_endpoint(field: str) -> Endpoint:
    """``0100007F:1F90`` (little-endian 32-bit words, as the kernel prints them) as an endpoint."""
    address_hex, port_hex = field.split(":")
    raw = bytes.fromhex(address_hex)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.IPv4Address(words) if len(words) == 4 else ipaddress.IPv6Address(words)
    return _canonical(address), int(port_hex, 16)


def _own_socket_inodes() -> set[str]:
    inodes: set[str] = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(_SOCKET_PREFIX):
            inodes.add(target[len(_SOCKET_PREFIX) : -1])
    return inodes


def connected_peers() -> set[Endpoint] | None:
    """Remote endpoints of this process's established TCP connections; ``None`` when /proc cannot say."""
    try:
        inodes = _own_socket_inodes()
        tables = [path.read_text() for path in _PROC_NET if path.exists()]
    except OSError:
        return None
    if not tables:
        return None
    peers: set[Endpoint] = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            if len(fields) > 9 and fields[3] == _ESTABLISHED and fields[9] in inodes:
                peers.add(_hex_endpoint(fields[2]))
    return peers
