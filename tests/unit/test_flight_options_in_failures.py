"""A failing test that made a Flight call with a bearer token must not print the token: pytest shows the arguments
of every frame in a long traceback, and the value of each sub-expression of a failed assertion (``where ... =``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SENTINEL = "tok-SENTINEL-0042"
# The token is built at run time, as a real test's comes from the catalog: the test's source line shows no token.
FAILING = """
import pyarrow.flight as flight

from tests.e2e.test_server import _bearer, _session_options

TOKEN = "-".join(["tok", "SENTINEL", "0042"])


def _read(client, options):
    return client.do_get(flight.Ticket(b"t"), options).read_all()


def test_do_get_fails():
    client = flight.connect("grpc://127.0.0.1:9")  # nothing listens: the call fails
    table = _read(client, _bearer(TOKEN))


def test_a_session_call_fails():
    options = _session_options(TOKEN, "s1", timeout=5)
    assert options is None
"""
ROOT = Path(__file__).resolve().parents[2]
# An assertion holding a call that takes a token: pytest would print the token as that call's argument.
TOKEN_IN_ASSERT = re.compile(r"^\s*assert\b.*\b(_bearer|_session_options|FlightCallOptions)\(")


def test_a_failed_flight_call_in_a_test_does_not_print_its_bearer_token(tmp_path: Path) -> None:
    test_file = tmp_path / "test_leak.py"
    test_file.write_text(FAILING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tb=long", str(test_file)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert "2 failed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    leaked = [line for line in done.stdout.splitlines() if SENTINEL in line]
    assert leaked == []
    assert "options = <FlightCallOptions" in done.stdout  # the options were shown, as pytest shows every argument


def test_no_assertion_in_the_tests_holds_a_call_that_takes_a_token() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if TOKEN_IN_ASSERT.match(line)
    ]
    assert found == []
