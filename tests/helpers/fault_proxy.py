"""A fault-injecting HTTP reverse proxy on loopback, in-process (``FaultProxy``) or as its own process.

It answers the first N requests matching a (method, path regex) rule itself (a status such as 503 or 429, with an
optional ``Retry-After``), or delays them before forwarding (a slow catalog), or forwards them and answers its own
status instead of the upstream's (``lose_answer``: the request took effect, its answer was lost on the way back),
and forwards everything else to the
upstream, counting every request by method and path. An unreachable upstream (a catalog being restarted) gets
a 502 with an ErrorModel body, as a real reverse proxy would answer.

As a process (``python tests/helpers/fault_proxy.py --upstream URL --port-file FILE``) it is controlled over its
own port: ``POST /__proxy__/inject`` with a JSON rule, ``POST /__proxy__/reset``, ``GET /__proxy__/stats``.
``FaultProxyProcess`` starts one and drives those endpoints. Only the standard library is used, so the child
starts fast and does not share the GIL with the load it sits in front of.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "upgrade"}
CONTROL_PREFIX = "/__proxy__/"
Rewrite = Callable[[str, str, dict[str, Any]], dict[str, Any]]


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int  # 0: no answer of its own, only the delay, then forward
    remaining: int
    retry_after: str | None = None
    delay: float = 0.0
    lose_answer: bool = False  # forwarded first: the upstream acted, its answer is replaced by ``status``


class _QuietServer(ThreadingHTTPServer):
    """A client closing a kept connection between requests is normal for a proxy (the engine's pools do): not a
    traceback on stderr, which test processes outside pytest's capture would print into the run's output."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class FaultProxy:
    """A threading HTTP reverse proxy: injects queued faults, forwards the rest, counts every request."""

    upstream: str
    faults: list[Fault] = field(default_factory=list)
    received: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request
    rewrite: Rewrite | None = None  # edits forwarded JSON bodies (a hostile catalog)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None
    outcomes: Counter[str] = field(default_factory=Counter)  # injected-503, delayed, upstream-down, forwarded
    # Forward the client's Host header (a store that checks SigV4 signatures, which cover it).
    keep_host: bool = False
    # The Range header of every ranged request, by path; and the most requests handled at once since the last
    # reset. A request received before a reset is not counted after it: its handler can still be finishing (its
    # answer already with the client) when the test resets and sends the requests it counts.
    ranges: list[tuple[str, str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    generation: int = 0

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def inject(
        self,
        method: str,
        path: str,
        status: int,
        times: int,
        retry_after: str | None = None,
        delay: float = 0.0,
        *,
        lose_answer: bool = False,
    ) -> None:
        with self.lock:
            self.faults.append(Fault(method, re.compile(path), status, times, retry_after, delay, lose_answer))

    def count(self, method: str, path: str) -> int:
        pattern = re.compile(path)
        with self.lock:
            return sum(1 for m, p in self.received if m == method and pattern.search(p))

    def reset(self) -> None:
        with self.lock:
            self.faults.clear()
            self.received.clear()
            self.ranges.clear()
            self.generation += 1
            self.in_flight = 0
            self.max_in_flight = 0
        self.rewrite = None

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            self.received.append((method, path))
            for fault in self.faults:
                if fault.remaining > 0 and (fault.method in (method, "*")) and fault.path.search(path):
                    fault.remaining -= 1
                    return fault
        return None

    def start(self, port: int = 0) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures anyway
                pass

            def do_GET(self) -> None:
                proxy.handle(self)

            do_POST = do_DELETE = do_HEAD = do_PUT = do_GET

        self.server = _QuietServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        if request.path.startswith(CONTROL_PREFIX):
            self.control(request, body)
            return
        with self.lock:
            generation = self.generation
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if request.headers.get("Range"):
                self.ranges.append((request.path, request.headers["Range"]))
        try:
            self._handle(request, body)
        finally:
            with self.lock:
                if generation == self.generation:
                    self.in_flight -= 1

    def _handle(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        fault = self.take_fault(request.command, request.path)
        if fault is not None and fault.delay:
            time.sleep(fault.delay)
        if fault is not None and fault.lose_answer:
            self._upstream(request, body)  # its answer never reaches the client
        if fault is not None and fault.status:
            self._tally(f"injected-{fault.status}")
            self.answer(request, fault.status, f"injected {fault.status}", "InjectedFault", fault.retry_after)
            return
        self._tally("delayed" if fault is not None else "forwarded")
        self.forward(request, body)

    def _tally(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] += 1

    @staticmethod
    def answer(
        request: BaseHTTPRequestHandler, status: int, message: str, kind: str, retry_after: str | None = None
    ) -> None:
        payload = {"error": {"message": message, "type": kind, "code": status}}
        data = json.dumps(payload).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            request.send_header("Retry-After", retry_after)
        request.end_headers()
        request.wfile.write(data)

    def _upstream(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[http.client.HTTPResponse, bytes] | None:
        """The upstream's answer to ``request`` and its body; None when the upstream is not reachable."""
        target = urlsplit(self.upstream)
        connection = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=60)
        dropped = HOP_BY_HOP if self.keep_host else HOP_BY_HOP | {"host"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
        try:
            connection.request(request.command, request.path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response, response.read()
        except OSError:
            return None
        finally:
            connection.close()

    def forward(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        answered = self._upstream(request, body)
        if answered is None:
            self._tally("upstream-down")
            self.answer(request, 502, "bad gateway: the catalog is not reachable", "ServiceUnavailableException")
            return
        response, data = answered
        if self.rewrite is not None and data and "json" in (response.getheader("Content-Type") or ""):
            data = json.dumps(self.rewrite(request.command, request.path, json.loads(data))).encode()
        request.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                request.send_header(name, value)
        # A HEAD's answer has no body but the length of the one a GET would get (S3 clients size files by it).
        length = response.getheader("Content-Length") if request.command == "HEAD" else None
        request.send_header("Content-Length", length or str(len(data)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(data)

    def control(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        """The process form's control endpoints (never forwarded)."""
        action = request.path[len(CONTROL_PREFIX) :]
        if action == "inject" and request.command == "POST":
            rule = json.loads(body)
            self.inject(
                rule.get("method", "*"),
                rule.get("path", ".*"),
                int(rule.get("status", 0)),
                int(rule["times"]),
                rule.get("retry_after"),
                float(rule.get("delay", 0.0)),
            )
        elif action == "reset" and request.command == "POST":
            with self.lock:
                self.faults.clear()
        elif action != "stats":
            self.answer(request, 404, f"no control action {action!r}", "NoSuchActionException")
            return
        with self.lock:
            stats = {"requests": len(self.received), "outcomes": dict(self.outcomes)}
        data = json.dumps(stats).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)


@contextmanager
def running_proxy(upstream: str) -> Iterator[FaultProxy]:
    """A started FaultProxy in front of ``upstream``, stopped on leaving."""
    proxy = FaultProxy(upstream)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


class FaultProxyProcess:
    """A ``FaultProxy`` in a child process of its own, driven over its control endpoints."""

    def __init__(self, upstream: str, workdir: Path) -> None:
        port_file = workdir / "fault-proxy.port"
        port_file.unlink(missing_ok=True)
        self.log_path = workdir / "fault-proxy.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--upstream", upstream, "--port-file", str(port_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the fault proxy did not start (see {self.log_path})")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"

    def _call(self, action: str, rule: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(rule or {}).encode()
        method = "GET" if action == "stats" else "POST"
        request = urllib.request.Request(f"{self.url}{CONTROL_PREFIX}{action}", data=data, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.loads(response.read())
        return result

    def inject(
        self,
        status: int,
        times: int,
        *,
        method: str = "*",
        path: str = ".*",
        retry_after: str | None = None,
        delay: float = 0.0,
    ) -> None:
        rule = {"method": method, "path": path, "status": status, "times": times, "delay": delay}
        self._call("inject", {**rule, "retry_after": retry_after})

    def reset(self) -> None:
        self._call("reset")

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port-file", required=True, type=Path)
    args = parser.parse_args(argv)
    proxy = FaultProxy(args.upstream)
    proxy.start()
    assert proxy.server is not None
    args.port_file.write_text(str(proxy.server.server_address[1]))
    threading.Event().wait()  # serve until terminated
    return 0


if __name__ == "__main__":
    sys.exit(main())
