"""Network address helpers shared by the engine's Flight server, the bundled catalog and the scan workers."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost`` or a loopback IP); names that need DNS do not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def address_host(address: str) -> str:
    """The host of a gRPC ``host:port`` address, an IPv6 one without its brackets (``[::1]:7001`` → ``::1``).

    Anything else (no port, ``unix:`` paths) gives a host :func:`is_loopback` refuses, so callers fail closed."""
    host = address.rpartition(":")[0]
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host
