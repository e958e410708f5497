"""How fast the servers start and stop: ``sqe-catalog serve`` and ``sqe-worker``, whole processes, measured.

Starts the embedded stack (moto S3 + STS and sqe-catalog, no SQE server) for a catalog configuration, then, in
alternating rounds, spawns

- ``python -m sqe_catalog.cli serve`` on that configuration (its own free port): ready = its first answer on
  ``/v1/config`` (a 401: it serves), then SIGTERM and the time until the process is gone;
- ``python -m workers.cli --listen 127.0.0.1:0 --insecure-no-token --port-file F``: ready = the port file written,
  then SIGTERM and the time until the process is gone;

and prints the medians. With ``--baseline-python`` (another checkout's interpreter, e.g. a wrapper that puts its
tree first on ``PYTHONPATH``) the same under it, interleaved, and the ratios baseline / this. Timings are printed,
never asserted; the machine may be shared, so read the ratios.

    .venv/bin/python bench/process_start.py [--rounds 7] [--baseline-python PATH]
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqe_stack import start_stack, stop_stack
from sqe_stack.provision import free_port, http_status

Timing = tuple[float, float]  # seconds to ready, seconds from SIGTERM to exit


def stopped(process: subprocess.Popen[bytes]) -> float:
    started = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    return time.perf_counter() - started


def wait_until(ready: Callable[[], bool], process: subprocess.Popen[bytes], what: str) -> None:
    """Polls every 5 ms (``sqe_stack``'s own wait backs off to 250 ms, which would blur the figure)."""
    deadline = time.monotonic() + 60
    while not ready():
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with status {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"{what} was not ready within 60 s")
        time.sleep(0.005)


def catalog_timing(python: str, template: str, work: Path) -> Timing:
    port = free_port()
    config = work / f"catalog-{port}.toml"
    config.write_text(re.sub(r"(?m)^port = \d+$", f"port = {port}", template, count=1), encoding="utf-8")

    def answers() -> bool:
        return http_status(f"http://127.0.0.1:{port}/v1/config", timeout=1) is not None  # a 401 too: it serves

    began = time.perf_counter()
    process = subprocess.Popen(
        [python, "-m", "sqe_catalog.cli", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=work,
    )
    wait_until(answers, process, "sqe-catalog")
    return time.perf_counter() - began, stopped(process)


def worker_timing(python: str, work: Path) -> Timing:
    port_file = work / f"worker-{time.monotonic_ns()}.port"
    began = time.perf_counter()
    argv = ["--listen", "127.0.0.1:0", "--insecure-no-token", "--port-file", str(port_file)]
    process = subprocess.Popen(
        [python, "-m", "workers.cli", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work
    )
    wait_until(lambda: port_file.exists() and bool(port_file.read_text().strip()), process, "sqe-worker")
    return time.perf_counter() - began, stopped(process)


def report(label: str, this: list[Timing], base: list[Timing] | None) -> None:
    ready, gone = (statistics.median(t[i] for t in this) * 1000 for i in (0, 1))
    line = f"  {label:<12} ready {ready:7.0f} ms   gone after SIGTERM {gone:6.0f} ms"
    if base:
        base_ready, base_gone = (statistics.median(t[i] for t in base) * 1000 for i in (0, 1))
        line += (
            f"   baseline {base_ready:.0f} / {base_gone:.0f} ms;"
            f" baseline/this: ready {base_ready / ready:.2f}x, gone {base_gone / gone:.2f}x"
        )
    print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="starts of each program per interpreter (median)")
    parser.add_argument("--baseline-python", help="another checkout's interpreter, run interleaved")
    args = parser.parse_args()
    pythons = {"this": sys.executable} | ({"base": args.baseline_python} if args.baseline_python else {})
    with tempfile.TemporaryDirectory(prefix="sqe-bench-start-") as tmp:
        work = Path(tmp)
        info = start_stack(work / "stack", serve=False)
        try:
            template = info.catalog_config.read_text(encoding="utf-8")
            catalogs: dict[str, list[Timing]] = {name: [] for name in pythons}
            workers: dict[str, list[Timing]] = {name: [] for name in pythons}
            for _ in range(args.rounds):
                for name, python in pythons.items():
                    catalogs[name].append(catalog_timing(python, template, work))
                    workers[name].append(worker_timing(python, work))
        finally:
            stop_stack(work / "stack")
    print(f"whole processes, medians of {args.rounds} (wall)")
    report("sqe-catalog", catalogs["this"], catalogs.get("base"))
    report("sqe-worker", workers["this"], workers.get("base"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
