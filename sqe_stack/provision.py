"""Process primitives shared by the stack's stores and the catalog: free ports, detached daemons, readiness
polling, PID-verified shutdown, and 0600 files for secrets. ``sqe stack``, ``make demo`` and the test session
fixtures all start their processes through these functions.

Every daemon is started as its own session (so closing the terminal that ran ``sqe stack up`` does not kill
it), with stdout/stderr appended to a log file and stdin closed. Shutdown never trusts a PID blindly: the
process's ``/proc/PID/cmdline`` must still contain the markers recorded at start, so a recycled PID that now
belongs to someone else is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqe._text import first_line
from sqe.errors import SQEError

LOOPBACK = "127.0.0.1"
# Ambient AWS settings a child must not inherit when it signs with a key of its own (``scrub_aws_env``).
_AWS_ENV_PREFIX = "AWS_"

# Popen handles of daemons started by this process, so their exit status is reaped (no zombies that would
# still look alive to /proc) and Python does not warn about children still running at exit.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class StackError(SQEError):
    """The local stack could not be started, stopped or inspected (one-line message, no secrets)."""


class MissingExtraError(StackError):
    """A store needs a package of the ``stack`` extra that is not installed (the message names the extra)."""


@dataclass(frozen=True)
class Daemon:
    """A background process of the stack: its PID and the cmdline markers that prove a PID is still it.

    ``process`` is the Popen handle when this Python process started it (None when read back from stack.json).
    """

    name: str
    pid: int
    markers: tuple[str, ...]
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def exit_code(self) -> int | None:
        """The exit status once a daemon started by this process has ended (negative: killed by that signal)."""
        return None if self.process is None else self.process.poll()


@dataclass(frozen=True)
class StoreHandle:
    """What an object store hands to the rest of ``stack up``: endpoints, the catalog's key, the role."""

    kind: str
    s3_endpoint: str
    sts_endpoint: str
    role_arn: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    daemons: tuple[Daemon, ...]

    @classmethod
    def one_endpoint(
        cls, kind: str, endpoint: str, role_arn: str, keys: tuple[str, str], daemons: tuple[Daemon, ...] = ()
    ) -> StoreHandle:
        """A store that serves S3 and STS on the same endpoint (moto, RGW, rustack); ``keys`` = (key id, secret)."""
        access_key_id, secret_access_key = keys
        return cls(kind, endpoint, endpoint, role_arn, access_key_id, secret_access_key, daemons)


def create_bucket(store: StoreHandle, bucket: str, region: str) -> None:
    """Create ``bucket`` on the store unless it exists, signed with the catalog's key (path-style: loopback has
    no DNS). An external store may already hold it; a store we just started never does."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    s3 = boto3.client(
        "s3",
        endpoint_url=store.s3_endpoint,
        region_name=region,
        aws_access_key_id=store.access_key_id,
        aws_secret_access_key=store.secret_access_key,
        config=Config(s3={"addressing_style": "path"}),
    )
    try:
        s3.head_bucket(Bucket=bucket)
        return
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise StackError(f"bucket {bucket!r} on {store.s3_endpoint}: {first_line(exc)}") from None
    s3.create_bucket(Bucket=bucket)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (all sockets held open together, so the kernel cannot repeat one)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def spawn(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    markers: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    scrub_aws_env: bool = False,
) -> Daemon:
    """Start ``argv`` detached (own session, stdin closed, output appended to ``log_path``).

    ``scrub_aws_env`` drops every inherited ``AWS_*`` variable (``env`` may set some again) and turns off the
    EC2 metadata lookup: a process that signs with a configured key must never pick up ambient credentials.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if not (scrub_aws_env and k.startswith(_AWS_ENV_PREFIX))}
    if scrub_aws_env:
        inherited["AWS_EC2_METADATA_DISABLED"] = "true"
    full_env = {**inherited, **(env or {})}
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=full_env,
                close_fds=True,
            )
        except OSError as exc:
            raise StackError(f"cannot start {name}: {exc.strerror or exc}") from None
    _CHILDREN[proc.pid] = proc
    return Daemon(name=name, pid=proc.pid, markers=tuple(markers), process=proc)


def run_tool(
    argv: Sequence[str],
    what: str,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run a short command to completion and return its stdout; failure -> StackError naming ``what``.

    The error quotes only the last line of stderr: tools here never print secrets on stderr, while stdout
    (which may carry a freshly created secret) is never quoted.
    """
    full_env = {**os.environ, **(env or {})}
    try:
        done = subprocess.run(
            list(argv),
            input=b"",
            capture_output=True,
            timeout=timeout,
            env=full_env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise StackError(f"{what}: timed out after {timeout:.0f} s") from None
    except OSError as exc:
        raise StackError(f"{what}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        detail = lines[-1] if lines else f"exit status {done.returncode}"
        raise StackError(f"{what} failed: {detail}")
    return done.stdout.decode(errors="replace")


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def wait_until(
    ready: Callable[[], bool], what: str, timeout: float, watch: Sequence[Daemon] = (), log_hint: str = ""
) -> None:
    """Poll ``ready`` until it is true; fail early if one of ``watch`` died, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        if ready():
            return
        for daemon in watch:
            if not pid_alive(daemon.pid):
                raise StackError(f"{daemon.name} exited during start-up{log_hint}")
        if time.monotonic() > deadline:
            raise StackError(f"{what} did not come up within {timeout:.0f} s{log_hint}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _reap(pid: int) -> None:
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        del _CHILDREN[pid]
        return
    if proc is None:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    _reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # Field 3 (after the parenthesised command name, which may contain spaces) is the state letter.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def pid_matches(pid: int, markers: Sequence[str]) -> bool:
    """True if ``pid`` is alive and its cmdline contains every marker (it is still the process we started)."""
    if not pid_alive(pid):
        return False
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    joined = " ".join(args)
    return all(marker in joined for marker in markers)


def stop_daemon(daemon: Daemon, grace: float = 5.0, sig: signal.Signals = signal.SIGTERM) -> str:
    """``sig`` (SIGTERM), wait up to ``grace`` s, then SIGKILL. Returns stopped/killed/gone/not-ours."""
    if not pid_alive(daemon.pid):
        return "gone"
    if not pid_matches(daemon.pid, daemon.markers):
        return "not-ours"
    if not _signal(daemon.pid, sig):
        return "gone"
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not pid_alive(daemon.pid):
            return "stopped"
        time.sleep(0.05)
    _signal(daemon.pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while pid_alive(daemon.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "killed"


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only (created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def toml_str(value: str) -> str:
    """A TOML basic string (JSON string escaping is a valid subset of TOML's)."""
    return json.dumps(value)
