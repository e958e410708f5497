"""Worker start-up and plumbing: environment lockdown, token files, fail-closed flags, IPC slicing, push checks."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from urllib.parse import quote

import grpc
import pyarrow as pa
import pytest

from sqe.config import CacheConfig, MemoryConfig
from sqe.credentials import CredentialSet
from sqe.distributed.coordinator.options import MIN_KEEPALIVE_SECONDS
from sqe.distributed.protocol.errors import KIND_CREDENTIAL_EXPIRED, KIND_READ_FAILED, MessageTooLargeError
from sqe.distributed.protocol.ipc import decode_batch, decode_schema, encode_batch, encode_schema
from sqe.distributed.protocol.ticket import WireTableId, decode_ticket
from sqe.errors import ConfigError
from tests.unit.workers.worker_fixtures import LocalTables, ticket_for
from workers.cli import _parser, main, options_from_args
from workers.environment import ambient_credentials_disabled, scrub_environment
from workers.fileio import FragmentFileIO
from workers.fragment import RunningFragment
from workers.heartbeat import MAX_HEARTBEAT_MS, MIN_HEARTBEAT_MS, heartbeat_interval_ms
from workers.server import Keepalive, ProcessMemory, ServerOptions, create_server
from workers.service import ServiceSettings, WorkerService, _refusal, fragment_failure

# ------------------------------------------------------------------------------------------- environment


def test_scrub_removes_every_aws_variable_and_locks_the_sdk_down() -> None:
    environ = {
        "AWS_ACCESS_KEY_ID": "AKIA",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_SESSION_TOKEN": "t",
        "AWS_PROFILE": "prod",
        "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token",
        "aws_role_arn": "arn",
        "PATH": "/bin",
    }
    assert not ambient_credentials_disabled(environ)
    removed = scrub_environment(environ)
    assert removed == sorted(["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                              "AWS_WEB_IDENTITY_TOKEN_FILE", "aws_role_arn"])  # fmt: skip
    assert environ == {
        "PATH": "/bin",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    assert ambient_credentials_disabled(environ)
    assert not ambient_credentials_disabled({**environ, "AWS_CONFIG_FILE": "/home/u/.aws/config"})


# ---------------------------------------------------------------------------------------- flags, tokens


def args(*argv: str) -> ServerOptions:
    return options_from_args(_parser().parse_args(["--listen", "127.0.0.1:0", *argv]))


def test_no_token_file_refuses_to_start_unless_explicitly_insecure() -> None:
    with pytest.raises(ConfigError, match="refusing to start without authentication"):
        args()
    assert args("--insecure-no-token").token is None


def test_memory_flags_default_to_the_engines_and_refuse_negative_values() -> None:
    defaults = CacheConfig()
    assert args("--insecure-no-token").memory == ProcessMemory(
        defaults.data_bytes, defaults.decoded_bytes, MemoryConfig().keep_freed_bytes
    )
    given = ["--data-cache-bytes", "0", "--decoded-cache-bytes", "1024", "--keep-freed-bytes", "0"]
    assert args("--insecure-no-token", *given).memory == ProcessMemory(0, 1024, 0)
    for flag in ("--data-cache-bytes", "--decoded-cache-bytes", "--keep-freed-bytes"):
        with pytest.raises(ConfigError, match=f"{flag} must not be negative"):
            args("--insecure-no-token", flag, "-1")


def test_prefetch_is_off_unless_asked_reaches_the_scan_executor_and_needs_the_data_cache() -> None:
    assert args("--insecure-no-token").service.prefetch is False
    on = args("--insecure-no-token", "--prefetch")
    assert on.service.prefetch is True
    assert WorkerService(on.service)._executor.prefetch is True
    assert WorkerService(args("--insecure-no-token").service)._executor.prefetch is False
    with pytest.raises(ConfigError, match="--prefetch needs --data-cache-bytes above 0"):
        args("--insecure-no-token", "--prefetch", "--data-cache-bytes", "0")


def test_keepalive_flags_are_taken_and_checked() -> None:
    assert args("--insecure-no-token").keepalive == Keepalive(30_000, 10_000)
    assert args("--insecure-no-token", "--keepalive-ms", "500", "--keepalive-timeout-ms", "1000").keepalive == (
        Keepalive(500, 1000)
    )
    for flag in ("--keepalive-ms", "--keepalive-timeout-ms"):
        with pytest.raises(ConfigError, match=f"{flag} must be at least 100"):
            args("--insecure-no-token", flag, "99")
    # The worker lets clients ping as often as the coordinator's fastest keepalive allows, and keeps pinging a
    # stream that sends nothing for a while: no GOAWAY too_many_pings, no keepalive that stops after two pings.
    options = dict(Keepalive().channel_options())
    assert options["grpc.http2.min_ping_interval_without_data_ms"] <= MIN_KEEPALIVE_SECONDS * 1000
    assert options["grpc.keepalive_permit_without_calls"] == 1 and options["grpc.http2.max_pings_without_data"] == 0


def test_heartbeat_intervals_are_bounded() -> None:
    assert heartbeat_interval_ms(0) == 0  # not asked: none
    assert heartbeat_interval_ms(1) == MIN_HEARTBEAT_MS
    assert heartbeat_interval_ms(5000) == 5000
    assert heartbeat_interval_ms(2**32 - 1) == MAX_HEARTBEAT_MS


def test_token_files_are_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "token"
    good.write_text("  0123456789abcdef0123\n")
    options = args("--token-file", str(good))
    assert options.token == "0123456789abcdef0123"
    assert "0123456789abcdef0123" not in repr(options)
    short = tmp_path / "short"
    short.write_text("abc")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        args("--token-file", str(short))
    with pytest.raises(ConfigError, match="cannot read the token file"):
        args("--token-file", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="contradict"):
        args("--token-file", str(good), "--insecure-no-token")


def test_message_limit_and_tls_pairs_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 65536"):
        create_server(ServerOptions("127.0.0.1:0", None, service=ServiceSettings(max_message_bytes=1000)))
    with pytest.raises(ConfigError, match="go together"):
        create_server(ServerOptions("127.0.0.1:0", None, tls_cert=b"x"))


@pytest.mark.parametrize(
    "listen", ["0.0.0.0:7001", "[::]:7001", ":7001", "10.1.2.3:7001", "worker-1:7001", "localhost.example:7001"]
)
def test_plaintext_is_refused_off_loopback(listen: str) -> None:
    """Nothing binds: the options are refused as they are made."""
    parsed = _parser().parse_args(["--listen", listen, "--insecure-no-token"])
    with pytest.raises(ConfigError, match=r"is not a loopback address; plaintext is only served on loopback \(give"):
        options_from_args(parsed)
    with pytest.raises(ConfigError, match="not a loopback address"):
        ServerOptions(listen, "t" * 32)


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "127.0.0.2:7001", "localhost:0", "[::1]:0"])
def test_plaintext_is_served_on_loopback(listen: str) -> None:
    assert options_from_args(_parser().parse_args(["--listen", listen, "--insecure-no-token"])).listen == listen


def test_off_loopback_with_a_certificate_is_accepted() -> None:
    options = ServerOptions("0.0.0.0:7001", "t" * 32, tls_cert=b"cert", tls_key=b"key")  # made, never bound
    assert options.listen == "0.0.0.0:7001"


@pytest.mark.parametrize("listen", ["0.0.0.0:7001", "[::]:7001", "10.1.2.3:7001", "worker-1:7001"])
def test_no_token_is_refused_off_loopback_even_with_tls(listen: str) -> None:
    """TLS authenticates the worker, not its callers: without a token anyone who reaches the port could send
    tickets and credential pushes, so ``--insecure-no-token`` is for loopback experiments only."""
    with pytest.raises(ConfigError, match="without a token"):
        ServerOptions(listen, None, tls_cert=b"cert", tls_key=b"key")  # made, never bound
    parsed = _parser().parse_args(["--listen", listen, "--insecure-no-token"])
    parsed.tls_cert, parsed.tls_key = Path(__file__), Path(__file__)  # any readable file: never bound
    with pytest.raises(ConfigError, match="without a token"):
        options_from_args(parsed)


def test_the_cli_refuses_plaintext_off_loopback_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import workers.server

    served: list[ServerOptions] = []
    monkeypatch.setattr(workers.server, "serve", lambda options, port_file: served.append(options) or 0)
    assert main(["--listen", "0.0.0.0:7001", "--insecure-no-token"]) == 2
    assert served == []
    err = capsys.readouterr().err
    assert err == (
        "sqe-worker: error: --listen '0.0.0.0:7001' is not a loopback address; plaintext is only served on "
        "loopback (give --tls-cert and --tls-key)\n"
    )


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "127.0.0.1:65536", "[::1]:70000", "127.0.0.1:\u00b2"])
def test_a_port_out_of_range_is_refused_not_wrapped(listen: str) -> None:
    """gRPC would bind 127.0.0.1:99999 as port 34463 (99999 - 65536) without a word."""
    with pytest.raises(ConfigError, match=r"port must be from 0 to 65535"):
        ServerOptions(listen, None)


def test_a_port_file_that_cannot_be_written_is_one_error_line(tmp_path: Path) -> None:
    """The real program: the worker stops and says why on one line, with no traceback."""
    import subprocess
    import sys

    port_file = tmp_path / "missing" / "port"
    argv = ["--listen", "127.0.0.1:0", "--insecure-no-token", "--port-file", str(port_file)]
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"sqe-worker: error: cannot write the port file {port_file}: ")


# ------------------------------------------------------------------------------------------------- IPC


def test_ipc_slices_fit_and_keep_every_row() -> None:
    batch = pa.record_batch({"id": pa.array(range(20_000), pa.int64()), "s": [f"value-{i}" for i in range(20_000)]})
    pieces = list(encode_batch(batch, 64 * 1024))
    assert len(pieces) > 2
    assert all(len(data) <= 64 * 1024 for data, _ in pieces)
    schema = decode_schema(encode_schema(batch.schema))
    rebuilt = pa.Table.from_batches([decode_batch(data, schema) for data, _ in pieces])
    assert rebuilt.equals(pa.Table.from_batches([batch]))
    assert sum(rows for _, rows in pieces) == 20_000


def test_a_row_larger_than_the_limit_is_a_clear_error() -> None:
    batch = pa.record_batch({"blob": [b"x" * 10_000]})
    with pytest.raises(MessageTooLargeError, match="single row"):
        list(encode_batch(batch, 4096))


# ---------------------------------------------------------------------------------------------- pushes


def pushed(**changes: object) -> CredentialSet:
    values: dict[str, object] = {
        "prefix": "s3://b/t",
        "access_key_id": "AK",
        "secret_access_key": "SECRET",
        "session_token": "TOKEN",
        # a day ahead: parametrize builds these at collection time, long before a full suite reaches them
        "expires_at_ms": int((time.time() + 86400) * 1000),
    }
    values.update(changes)
    return CredentialSet(**values)  # type: ignore[arg-type]


TABLE = WireTableId("wh", ("ns",), "t")


@pytest.mark.parametrize(
    ("sets", "query_id", "fragment_id", "table", "reason"),
    [
        ([pushed()], "q", "", None, "scope needs"),
        ([], "q", "f", None, "no credential sets"),
        ([pushed(session_token=None)], "q", "", TABLE, r"incomplete \(missing session token\); keeping"),
        ([pushed(expires_at_ms=None)], "", "f", None, r"incomplete \(missing expiry\)"),
        ([pushed(source="static")], "", "f", None, "not a vended set"),
        ([pushed(expires_at_ms=1000)], "", "f", None, "already expired"),
        ([pushed(), pushed(secret_access_key="")], "", "f", None, "missing secret access key"),
        ([pushed(prefix="file:///etc")], "", "f", None, "not for an s3:// location"),
        ([pushed(prefix="gs://b/t")], "", "f", None, "not for an s3:// location"),
        ([pushed(prefix="/var/data")], "", "f", None, "not for an s3:// location"),
    ],
)
def test_incomplete_or_pointless_pushes_are_refused(
    sets: list[CredentialSet], query_id: str, fragment_id: str, table: WireTableId | None, reason: str
) -> None:
    refusal = _refusal(sets, query_id, fragment_id, table)
    assert re.search(reason, refusal)
    assert "SECRET" not in refusal and "TOKEN" not in refusal


def test_a_complete_push_is_acceptable() -> None:
    assert _refusal([pushed()], "q", "", TABLE) == ""
    assert _refusal([pushed()], "", "f-1", None) == ""


def fragment_with(local_tables: LocalTables, cred: CredentialSet) -> RunningFragment:
    ticket = decode_ticket(ticket_for(local_tables.numbers, credentials=[cred]))
    cancel = threading.Event()
    return RunningFragment(ticket, FragmentFileIO(ticket.credentials, ticket.storage, cancel=cancel), cancel)


def test_read_errors_never_quote_a_secret_percent_encoded_or_cut_short(local_tables: LocalTables) -> None:
    secret, token = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "FwoGZXIvYXdzEXAMPLE+session/token=="
    error = OSError(f"403 for GET ?X-Amz-Security-Token={quote(token, safe='')} signed with {secret[:30]}")
    failure = fragment_failure(
        error, fragment_with(local_tables, pushed(secret_access_key=secret, session_token=token))
    )
    assert secret[:16] not in failure.message and quote(token, safe="")[:16] not in failure.message
    assert "403 for GET ?X-Amz-Security-Token=*** signed with [redacted]" in failure.message


def test_read_errors_name_expiry_when_the_keys_died_and_never_a_secret(local_tables: LocalTables) -> None:
    error = OSError("AWS Error ACCESS_DENIED during GetObject for key AK signed with SECRET")
    live = fragment_failure(error, fragment_with(local_tables, pushed()))
    assert (live.code, live.kind) == (grpc.StatusCode.UNAVAILABLE, KIND_READ_FAILED)
    assert "AK " not in live.message and "SECRET" not in live.message and "[redacted]" in live.message
    dead = fragment_failure(error, fragment_with(local_tables, pushed(expires_at_ms=1000)))
    assert (dead.code, dead.kind) == (grpc.StatusCode.FAILED_PRECONDITION, KIND_CREDENTIAL_EXPIRED)
    assert re.fullmatch(r"credentials for s3://b/t expired at 1970-01-01T00:00:01\+00:00 and no refreshed set arrived",
                        dead.message)  # fmt: skip
    other = fragment_failure(KeyError("a data value"), fragment_with(local_tables, pushed()))
    assert other.code == grpc.StatusCode.INTERNAL and "a data value" not in other.message


@pytest.mark.parametrize("cut", [8, 20])
def test_a_secret_cut_by_the_length_limit_is_still_scrubbed(local_tables: LocalTables, cut: int) -> None:
    """The message is bounded to 1000 characters: a secret straddling that bound must not leave its head."""
    cred = pushed(secret_access_key="S3CR3T-" + "x" * 33, session_token="T0K3N-" + "y" * 60)
    for secret in (cred.secret_access_key, cred.session_token or ""):
        error = OSError("e" * (1000 - cut) + secret + " tail")
        failure = fragment_failure(error, fragment_with(local_tables, cred))
        assert secret[:cut] not in failure.message.removeprefix("fragment f-1: reading failed: ")


def test_a_secret_holding_another_is_scrubbed_whole(local_tables: LocalTables) -> None:
    """Whichever order the values are replaced in, no part of the longer one stays (the key id inside a token)."""
    cred = pushed(access_key_id="AKID", session_token="TOKEN-HEAD-AKID-TOKEN-TAIL")
    failure = fragment_failure(OSError(f"denied for {cred.session_token}"), fragment_with(local_tables, cred))
    assert "TOKEN-HEAD" not in failure.message and "TOKEN-TAIL" not in failure.message


def test_aggregate_limits_default_to_a_share_of_the_machine_and_are_checked() -> None:
    """Each fragment's partial-aggregation database: its ``--max-fragments`` share of half the memory (or of the
    control group's limit) and of half the spill disk's free space, one thread; given flags as given."""
    from sqe._machine import MIN_DATABASE_MEMORY_BYTES, physical_memory_bytes
    from sqe.duckdb_connection import DatabaseLimits, spill_disk_free_bytes

    limits = args("--insecure-no-token", "--max-fragments", "4").service.aggregate_limits
    assert limits is not None
    assert limits.memory_bytes == max(MIN_DATABASE_MEMORY_BYTES, physical_memory_bytes() // 2 // 4)
    assert limits.threads == 1 and 0 < limits.spill_bytes <= spill_disk_free_bytes() // 4  # free space moves
    given = ("--aggregate-memory-bytes", str(64 << 20), "--aggregate-threads", "2", "--aggregate-spill-bytes", "0")
    assert args("--insecure-no-token", *given).service.aggregate_limits == DatabaseLimits(64 << 20, 2, 0)
    refused = {
        ("--aggregate-memory-bytes", str((16 << 20) - 1)): "--aggregate-memory-bytes must be at least 16777216",
        ("--aggregate-memory-bytes", str(2**63)): "--aggregate-memory-bytes must be at least",
        ("--aggregate-threads", "0"): "--aggregate-threads must be at least 1 and at most 1024",
        ("--aggregate-threads", "100000"): "--aggregate-threads must be at least 1 and at most 1024",
        ("--aggregate-spill-bytes", "-1"): "--aggregate-spill-bytes must be at least 0",
    }
    for flag, message in refused.items():
        with pytest.raises(ConfigError, match=message):
            args("--insecure-no-token", *flag)


def test_the_cli_refuses_a_bad_aggregate_limit_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--listen", "127.0.0.1:0", "--insecure-no-token", "--aggregate-threads", "0"]) == 2
    assert capsys.readouterr().err == "sqe-worker: error: --aggregate-threads must be at least 1 and at most 1024\n"


def test_each_fragment_gets_a_database_of_its_own_within_its_limits() -> None:
    """Two fragments at once get two databases, each with the limits and a spill directory of its own; a
    database given back is lent again rather than a new one opened."""
    from sqe.duckdb_connection import DatabaseLimits
    from workers.databases import AggregateDatabases

    databases = AggregateDatabases(DatabaseLimits(32 << 20, 1, 1 << 20), 2)
    cancel = threading.Event()
    settings = (
        "SELECT current_setting('memory_limit'), current_setting('max_temp_directory_size'), "
        "current_setting('temp_directory')"
    )
    with databases.lent(cancel) as first, databases.lent(cancel) as second:
        assert first is not second
        one, two = first.execute(settings).fetchone(), second.execute(settings).fetchone()
        assert one is not None and two is not None
        assert one[:2] == two[:2] == ("32.0 MiB", "1.0 MiB")
        assert one[2] != two[2]
    with databases.lent(cancel) as again:
        assert again in (first, second)


def test_a_database_that_no_longer_answers_is_not_lent_again() -> None:
    """Found by review: every database went back into the pool as it came out, so one a fragment left unusable
    (DuckDB invalidates a database after a fatal error; here: closed) was lent to the next fragment, and to every
    one after, each failing at once. It is closed and left out now; the next fragment gets a new database."""
    from sqe.duckdb_connection import DatabaseLimits
    from workers.databases import AggregateDatabases

    databases = AggregateDatabases(DatabaseLimits(32 << 20, 1, 0), 1)
    cancel = threading.Event()
    with databases.lent(cancel) as broken:
        broken.close()
    with databases.lent(cancel) as next_one:
        assert next_one is not broken
        assert next_one.execute("SELECT 42").fetchall() == [(42,)]


def test_a_fragment_waiting_for_a_database_stops_at_its_cancel_and_an_error_gives_it_back() -> None:
    """With every database lent, a fragment waits; its cancel ends the wait (QueryCancelledError, nothing
    lent), and a database whose fragment failed is given back and lent again."""
    from sqe.duckdb_connection import DatabaseLimits
    from sqe.execution.local import QueryCancelledError
    from workers.databases import AggregateDatabases

    databases = AggregateDatabases(DatabaseLimits(32 << 20, 1, 0), 1)
    held, cancel = threading.Event(), threading.Event()
    with databases.lent(held) as only:
        failed: list[BaseException] = []

        def wait() -> None:
            try:
                with databases.lent(cancel):
                    pass
            except BaseException as exc:
                failed.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        cancel.set()
        waiter.join(timeout=30)
        assert not waiter.is_alive() and len(failed) == 1 and isinstance(failed[0], QueryCancelledError)
    with pytest.raises(ZeroDivisionError), databases.lent(held) as again:
        assert again is only
        _ = 1 // 0
    with databases.lent(held) as after_error:
        assert after_error is only
