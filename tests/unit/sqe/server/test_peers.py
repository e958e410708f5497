"""``sqe.server.peers``: gRPC peer strings and the process's established connections, over real sockets."""

from __future__ import annotations

import socket
import time

from sqe.server.peers import connected_peers, parse_peer


def test_peer_strings_of_both_families_parse_and_others_do_not() -> None:
    assert parse_peer("ipv4:127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert parse_peer("ipv6:[::1]:5001") == ("::1", 5001)
    assert parse_peer("ipv6:%5B::ffff:127.0.0.1%5D:5002") == ("127.0.0.1", 5002)  # v4-mapped compares as v4
    assert parse_peer("unix:/tmp/socket") is None
    assert parse_peer("ipv4:not-an-address:1") is None


def test_a_connection_is_listed_while_open_and_not_once_closed() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        client_end = parse_peer(f"ipv4:127.0.0.1:{client.getsockname()[1]}")
        peers = connected_peers()
        assert peers is not None and client_end in peers
        client.close()
        accepted.close()
        deadline = time.monotonic() + 5
        while client_end in (connected_peers() or set()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client_end not in (connected_peers() or set())
