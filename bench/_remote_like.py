"""A TCP relay on loopback that makes a local object store answer like a remote one, for bench/prefetch.py.

Each chunk a client sends waits ``--latency`` seconds before it is forwarded (a request's round trip), and each
connection's answers flow at most ``--mbps`` MB/s (one connection to a remote store has a throughput of its
own). It relays bytes unchanged, so signed requests verify as sent. Standard library only; run as a process of
its own, so it does not share the benchmark's GIL:

    python bench/_remote_like.py --upstream 127.0.0.1:PORT --port-file FILE [--latency 0.02] [--mbps 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

CHUNK = 1 << 18


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, rate: float) -> None:
    try:
        while data := await reader.read(CHUNK):
            if delay:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
            if rate:
                await asyncio.sleep(len(data) / rate)
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def _serve(upstream: str, port_file: Path, latency: float, mbps: float) -> None:
    host, port = upstream.rsplit(":", 1)

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        store_reader, store_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(
            _pipe(client_reader, store_writer, latency, 0.0), _pipe(store_reader, client_writer, 0.0, mbps * 1e6)
        )

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--upstream", required=True, help="host:port of the store")
    parser.add_argument("--port-file", required=True, type=Path)
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added to each request")
    parser.add_argument("--mbps", type=float, default=100.0, help="MB/s of each connection's answers")
    args = parser.parse_args()
    asyncio.run(_serve(args.upstream, args.port_file, args.latency, args.mbps))


if __name__ == "__main__":
    main()
