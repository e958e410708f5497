"""Fuzz the Flight SQL command decoder of a real ``sqe serve`` process.

Arbitrary bytes as a FlightDescriptor command, as a DoGet ticket and as the body of every action the server
lists, and near-valid ``google.protobuf.Any`` wrappers (wrong or odd type URLs, truncated or corrupt payloads),
all sent by an authenticated user. Property: a typed Flight error with one line of text naming SQE's error type,
never "internal error" and never a traceback (client side or in the server log); the server stays up.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from sqe.server._proto import flight_sql_pb2 as sql_pb
from tests.e2e.test_server import _principal, _reader_settings, _write_configs, start_server
from tests.fuzz.checks import assert_one_line
from tests.helpers.flight import bearer

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e]

SETTINGS = settings(max_examples=25, deadline=10_000)
PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."
COMMANDS = [
    "CommandStatementQuery",
    "CommandPreparedStatementQuery",
    "CommandGetCatalogs",
    "CommandGetDbSchemas",
    "CommandGetTables",
    "CommandGetSqlInfo",
    "CommandGetTableTypes",
    "TicketStatementQuery",
    "ActionCreatePreparedStatementRequest",
    "ActionClosePreparedStatementRequest",
]
METADATA_COMMANDS = {
    "arrow.flight.protocol.sql." + name
    for name in (
        "CommandGetCatalogs",
        "CommandGetTableTypes",
        "CommandGetSqlInfo",
        "CommandGetDbSchemas",
        "CommandGetTables",
    )
}
ACTIONS = ["CreatePreparedStatement", "ClosePreparedStatement", "CancelFlightInfo"]


class FuzzServer:
    """A running ``sqe serve`` and an authenticated client. Its repr hides the call options (the token)."""

    def __init__(self, client: flight.FlightClient, options: flight.FlightCallOptions, log_path: Path) -> None:
        self.client = client
        self.options = options
        self.log_path = log_path

    def __repr__(self) -> str:
        return "FuzzServer(...)"

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@pytest.fixture(scope="module")
def server(
    catalog_server: CatalogServer, catalog_reader: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FuzzServer]:
    from tests.helpers.processes import stop_child

    user = _principal(catalog_server, f"fuzz_user_{uuid.uuid4().hex[:6]}", [("NAMESPACE_LIST", None)])
    workdir = tmp_path_factory.mktemp("fuzz-serve")
    proc, port = start_server(workdir, _write_configs(workdir, catalog_server, **_reader_settings(catalog_reader)))
    token = catalog_server.token(user)
    options = bearer(token, timeout=20)
    client = flight.FlightClient(f"grpc://127.0.0.1:{port}")
    world = FuzzServer(client, options, workdir / "server.log")
    try:
        yield world
        assert proc.poll() is None, "sqe serve died during the fuzz run"
        log = world.log_text()
        assert "Traceback" not in log
        assert "internal error" not in log
    finally:
        client.close()
        stop_child(proc)


def _assert_typed(call: Callable[[], Any]) -> None:
    """The call fails with a typed, one-line Flight error from SQE (not pyarrow's catch-all, not INTERNAL)."""
    with pytest.raises(flight.FlightError) as caught:
        call()
    error = caught.value
    assert not isinstance(error, flight.FlightInternalError), error
    text = str(error)
    assert "Traceback" not in text
    assert_one_line(text.split(". Detail:")[0])  # pyarrow appends ". Detail: <status>" on the same line
    assert "Error:" in text, text  # SQE's ``TypeName: message``


def _assert_typed_get_schema(call: Callable[[], Any]) -> None:
    """As :func:`_assert_typed`, for GetSchema: pyarrow 26's GetSchema callback does not turn a FlightError into
    its status (GetFlightInfo does), so the client gets code UNKNOWN and the status detail is the formatted Python
    exception. ``sqe serve`` sets ``sys.tracebacklimit = 0`` so that detail is one line, never a traceback."""
    with pytest.raises(pa.ArrowException) as caught:
        call()
    text = str(caught.value)
    assert "Traceback" not in text and 'File "' not in text, text
    head = text.split(". Detail:")[0]
    assert_one_line(head)
    assert "Error:" in head and "internal error" not in head, head


def _answerable(command: bytes) -> bool:
    """Whether ``command`` is an Any naming a metadata command that needs no table (any host part). The
    payload of a field-less command (catalogs, table types) is not read, so only the name decides."""
    try:
        wrapper = any_pb2.Any.FromString(command)
    except DecodeError:
        return False
    return wrapper.type_url.rpartition("/")[2] in METADATA_COMMANDS


def _typed_or_answered(command: bytes, call: Callable[[], Any]) -> None:
    if _answerable(command):
        try:
            call()
        except flight.FlightError:
            _assert_typed(call)
    else:
        _assert_typed(call)


def _wrapped(type_url: str, value: bytes) -> bytes:
    return bytes(any_pb2.Any(type_url=type_url, value=value).SerializeToString())


type_urls = st.one_of(
    st.sampled_from([PREFIX + name for name in COMMANDS]),
    st.builds(lambda name: "evil.example/" + name, st.sampled_from(COMMANDS)),
    st.text(max_size=60),
    st.sampled_from(["", "/", ".", PREFIX, PREFIX + "CommandStatementQuery\nx", "type.googleapis.com/" + "x" * 5000]),
)
payloads = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"\x0a", b"\x0a\x05ab", b"\x0a\x02\xff\xfe", b"\x12\x80\x80\x80\x80\x10", b"\xff" * 10]),
)
near_valid_any = st.builds(_wrapped, type_urls, payloads)
commands = st.one_of(st.binary(max_size=300), near_valid_any)


# --------------------------------------------------------------------------------------------- fuzzing


@SETTINGS
@given(command=commands)
def test_get_flight_info_with_arbitrary_commands_fails_typed(server: FuzzServer, command: bytes) -> None:
    descriptor = flight.FlightDescriptor.for_command(command)
    _typed_or_answered(command, lambda: server.client.get_flight_info(descriptor, server.options))


@SETTINGS
@given(command=commands)
def test_get_schema_with_arbitrary_commands_fails_typed(server: FuzzServer, command: bytes) -> None:
    descriptor = flight.FlightDescriptor.for_command(command)
    call = lambda: server.client.get_schema(descriptor, server.options)  # noqa: E731
    if _answerable(command):
        try:
            call()
        except pa.ArrowException:
            _assert_typed_get_schema(call)
    else:
        _assert_typed_get_schema(call)


@SETTINGS
@given(ticket=commands)
def test_do_get_with_arbitrary_tickets_fails_typed(server: FuzzServer, ticket: bytes) -> None:
    _assert_typed(lambda: server.client.do_get(flight.Ticket(ticket), server.options).read_all())


@SETTINGS
@given(action=st.sampled_from(ACTIONS), body=commands)
def test_every_action_with_an_arbitrary_body_fails_typed_or_answers(
    server: FuzzServer, action: str, body: bytes
) -> None:
    try:
        results = list(server.client.do_action(flight.Action(action, body), server.options))
    except flight.FlightError:
        _assert_typed(lambda: list(server.client.do_action(flight.Action(action, body), server.options)))
        return
    # Closing an unknown handle is a no-op, and a valid empty SQL text may even prepare: both are answers.
    assert action in ("ClosePreparedStatement", "CreatePreparedStatement"), (action, results)


def test_the_server_survived_the_fuzzing(server: FuzzServer) -> None:
    catalogs = server.client.get_flight_info(
        flight.FlightDescriptor.for_command(_wrapped(PREFIX + "CommandGetCatalogs", b"")), server.options
    )
    assert catalogs.endpoints


# ------------------------------------------------------------------------------ regressions (examples)


def test_a_truncated_command_payload_is_a_typed_error(server: FuzzServer) -> None:
    # Found by fuzzing: the right type URL around a corrupt payload surfaced as "internal error".
    descriptor = flight.FlightDescriptor.for_command(_wrapped(PREFIX + "CommandStatementQuery", b"\x0a\x05ab"))
    with pytest.raises(
        flight.FlightServerError, match="QueryError: the CommandStatementQuery in the request is malformed"
    ):
        server.client.get_flight_info(descriptor, server.options)


def test_a_foreign_type_url_is_not_taken_for_a_flight_sql_command(server: FuzzServer) -> None:
    # Found by fuzzing: any type URL ending in ".CommandGetCatalogs" (here another package's) was answered.
    for type_url in ("type.googleapis.com/evil.CommandGetCatalogs", "\x00\x00.CommandGetCatalogs"):
        descriptor = flight.FlightDescriptor.for_command(_wrapped(type_url, b""))
        with pytest.raises(flight.FlightServerError, match="QueryError: this command is not supported"):
            server.client.get_flight_info(descriptor, server.options)
    real = flight.FlightDescriptor.for_command(_wrapped(PREFIX + "CommandGetCatalogs", b""))
    assert server.client.get_flight_info(real, server.options).endpoints
    packed = any_pb2.Any()
    packed.Pack(sql_pb.CommandGetCatalogs())
    assert server.client.get_flight_info(
        flight.FlightDescriptor.for_command(packed.SerializeToString()), server.options
    )
