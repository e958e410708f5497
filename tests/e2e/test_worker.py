"""``sqe-worker`` processes on loopback reading a real table from moto with catalog-vended credentials.

Data is written through sqe-catalog by a writer principal (pyiceberg, vended credentials); tickets carry sets taken
from raw load-table responses. A second principal (a reader) gives a second, distinct vended key, which plays the
refreshed set. Expiry is driven by the declared ``expires_at_ms`` (the keys themselves stay valid for 15 minutes),
so a paced scan outlives its set within seconds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DateType, IntegerType, LongType, NestedField, StringType

from sqe.catalog.base import TableIdent
from sqe.credentials import CredentialSet, parse_catalog_credentials
from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.executor import CoordinatorStats
from sqe.distributed.coordinator.push import CredentialPusher
from sqe.distributed.coordinator.refresh import Holder
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import ERROR_KIND_KEY
from sqe.distributed.protocol.ipc import decode_batch, decode_schema
from sqe.distributed.protocol.ticket import WireTableId, build_ticket, credentials_to_proto
from sqe.restrictions import EMPTY_PLAN, RestrictionPlan, apply, new_query_salt, parse_restrictions
from tests.conftest import pyiceberg_catalog, raw_load_table

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, WorkerFactory, WorkerProcess

pytestmark = pytest.mark.e2e

WRITER_GRANTS: list[tuple[str, str | None, str | None]] = [
    ("NAMESPACE_FULL_METADATA", None, None),
    ("TABLE_CREATE", None, None),
    ("TABLE_WRITE_DATA", None, None),
]
GROUPS = 4
ROWS_PER_APPEND = 2000
FILES = 2 * GROUPS  # two appends, one file per partition each
MAX_MESSAGE_BYTES = 64 * 1024  # the files' batches (~100 KB) must be sliced to fit
PACE_MS = 500


@dataclasses.dataclass(frozen=True)
class Fixture:
    table: Table
    ref: WireTableId
    writer_set: CredentialSet  # the writer's vended set (read+write)
    reader_set: CredentialSet  # another principal's vended set: a distinct key for the same prefix
    expected: pa.Table  # the table read locally through pyiceberg
    secrets: set[str]


def _vended_set(server: CatalogServer, principal: CatalogPrincipal, namespace: str, table: Table) -> CredentialSet:
    raw = raw_load_table(server, principal, namespace, "events")
    (cred,) = parse_catalog_credentials(raw).for_location(table.location())
    assert cred.missing_parts() == [], "the catalog must vend complete sets"
    return cred


@pytest.fixture(scope="module")
def data(catalog_server: CatalogServer) -> Fixture:
    suffix = uuid.uuid4().hex[:6]
    writer = catalog_server.principal_with_grants(f"worker_writer_{suffix}", WRITER_GRANTS)
    namespace = f"workers_{suffix}"
    catalog = pyiceberg_catalog(catalog_server, writer)
    catalog.create_namespace(namespace)
    reader = catalog_server.principal_with_grants(f"worker_reader_{suffix}", [("TABLE_READ_DATA", namespace, None)])
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "grp", IntegerType(), required=False),
        NestedField(3, "day", DateType(), required=False),
        NestedField(4, "label", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="grp"))
    table = catalog.create_table(f"{namespace}.events", schema=schema, partition_spec=spec)
    for start in (0, ROWS_PER_APPEND):
        ids = range(start, start + ROWS_PER_APPEND)
        table.append(
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "grp": pa.array([i % GROUPS for i in ids], pa.int32()),
                    "day": [dt.date(2024, 1, 1) + dt.timedelta(days=i % 40) for i in ids],
                    "label": [f"label-{i:06d}-" + "x" * 200 for i in ids],
                },
                schema=table.schema().as_arrow(),
            )
        )
    table = catalog.load_table(f"{namespace}.events")
    assert len(list(table.scan().plan_files())) == FILES
    writer_set = _vended_set(catalog_server, writer, namespace, table)
    reader_set = _vended_set(catalog_server, reader, namespace, table)
    assert writer_set.access_key_id != reader_set.access_key_id
    secrets = set(catalog_server.secrets) | {writer_set.access_key_id, reader_set.access_key_id}
    return Fixture(
        table, WireTableId("wh", (namespace,), "events"), writer_set, reader_set, table.scan().to_arrow(), secrets
    )


@pytest.fixture(scope="module")
def worker(worker_process_factory: WorkerFactory) -> WorkerProcess:
    return worker_process_factory.start("--max-message-bytes", str(MAX_MESSAGE_BYTES))


@pytest.fixture()
def paced_worker(worker_process_factory: WorkerFactory) -> Iterator[WorkerProcess]:
    """A fresh worker (its own Stats) reading one file at a time."""
    process = worker_process_factory.start("--max-files-in-flight", "1")
    yield process
    process.stop()


# --------------------------------------------------------------------------------------------------- helpers


def ticket(
    data: Fixture,
    credentials: list[CredentialSet],
    *,
    plan: RestrictionPlan = EMPTY_PLAN,
    output: tuple[str, ...] = ("id", "grp", "day", "label"),
    salt: bytes = b"",
    pace_ms: int = 0,
) -> pb.ScanTicket:
    schema = data.table.schema()
    output_ids = {schema.find_field(name).field_id for name in output}
    read_schema = schema.select(*[f.name for f in schema.columns if f.field_id in output_ids | plan.filter_field_ids])
    return build_ticket(
        query_id=f"q-{uuid.uuid4().hex[:8]}",
        fragment_id=f"f-{uuid.uuid4().hex[:8]}",
        table=data.ref,
        metadata=data.table.metadata,
        read_schema=read_schema,
        output_field_ids=output_ids,
        tasks=list(data.table.scan().plan_files()),
        credentials=credentials,
        restrictions=plan,
        salt=salt,
        pace_ms_per_file=pace_ms,
    )


def expiring(cred: CredentialSet, seconds: float) -> CredentialSet:
    return dataclasses.replace(cred, expires_at_ms=int((time.time() + seconds) * 1000))


def collect(responses: Iterator[pb.ExecuteResponse]) -> tuple[pa.Table, list[pb.ExecuteResponse]]:
    messages = list(responses)
    schema = decode_schema(messages[0].schema.ipc)
    batches = [decode_batch(m.batch.ipc, schema) for m in messages if m.WhichOneof("payload") == "batch"]
    return pa.Table.from_batches(batches, schema=schema), messages


def rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda row: row["id"])


def assert_no_secrets(worker: WorkerProcess, secrets: set[str]) -> None:
    log = worker.log_text()
    assert "fragment" in log  # the log is the real one
    leaked = [secret[:4] + "..." for secret in secrets | {worker.token} if secret and secret in log]
    assert not leaked, f"secrets in the worker log: {leaked}"


# --------------------------------------------------------------------------------------------------- reading


def test_execute_returns_exactly_the_tables_rows(worker: WorkerProcess, data: Fixture) -> None:
    result, messages = collect(worker.stub().Execute(ticket(data, [data.writer_set]), metadata=worker.metadata()))
    assert result.num_rows == 2 * ROWS_PER_APPEND
    assert rows(result) == rows(data.expected)
    kinds = [m.WhichOneof("payload") for m in messages]
    assert kinds[0] == "schema" and kinds[-1] == "complete" and "progress" in kinds
    assert messages[-1].complete.rows == 2 * ROWS_PER_APPEND and messages[-1].complete.files == FILES
    batch_sizes = [m.ByteSize() for m in messages if m.WhichOneof("payload") == "batch"]
    assert len(batch_sizes) > FILES and max(batch_sizes) <= MAX_MESSAGE_BYTES  # sliced under the limit


def test_restrictions_in_the_ticket_are_applied_as_locally(worker: WorkerProcess, data: Fixture) -> None:
    schema = data.table.schema()
    raw = {
        "required-row-filter": {"type": "lt", "left": {"type": "reference", "id": 2}, "right": 2},
        "required-column-projections": [
            {"field-id": 4, "action": "sha-256-query-local"},
            {"field-id": 3, "action": "truncate-to-month"},
        ],
    }
    plan = parse_restrictions(raw, schema, all_schemas=data.table.metadata.schemas)
    salt = new_query_salt()
    output = ("id", "day", "label")
    wire = ticket(data, [data.writer_set], plan=plan, output=output, salt=salt)
    result, _ = collect(worker.stub().Execute(wire, metadata=worker.metadata()))
    read_schema = schema.select("id", "grp", "day", "label")
    output_ids = {1, 3, 4}
    local = data.table.scan(selected_fields=("id", "grp", "day", "label")).to_arrow()
    expected = pa.Table.from_batches(
        [apply(b, plan, salt=salt, schema=read_schema, output_field_ids=output_ids) for b in local.to_batches()]
    )
    assert result.column_names == list(output)
    assert result.num_rows == 2 * ROWS_PER_APPEND // 2  # groups 0 and 1
    assert rows(result) == rows(expected)
    assert all(len(label) == 64 for label in result.column("label").to_pylist())  # hex digests, not labels


# ------------------------------------------------------------------------------------------- authentication


def _calls(data: Fixture) -> dict[str, Any]:
    sample = ticket(data, [data.writer_set])
    return {
        "Execute": lambda stub, md: list(stub.Execute(sample, metadata=md)),
        "RefreshCredentials": lambda stub, md: stub.RefreshCredentials(
            pb.RefreshRequest(fragment_id=sample.fragment_id, credentials=[credentials_to_proto(data.reader_set)]),
            metadata=md,
        ),
        "Cancel": lambda stub, md: stub.Cancel(pb.CancelRequest(query_id=sample.query_id), metadata=md),
        "Health": lambda stub, md: stub.Health(pb.HealthRequest(), metadata=md),
        "Stats": lambda stub, md: stub.Stats(pb.StatsRequest(), metadata=md),
    }


def test_every_rpc_rejects_missing_and_wrong_tokens(worker: WorkerProcess, data: Fixture) -> None:
    stub = worker.stub()
    before = stub.Stats(pb.StatsRequest(), metadata=worker.metadata())
    bad_metadata = [
        (),
        worker.metadata("wrong-token-of-a-decent-length"),
        worker.metadata(worker.token + "x"),
        (("authorization", worker.token),),  # no "Bearer "
        (("authorization", f"bearer {worker.token}"),),
        (*worker.metadata(), *worker.metadata("wrong-token-of-a-decent-length")),  # two values
    ]
    for name, call in _calls(data).items():
        for metadata in bad_metadata:
            with pytest.raises(grpc.RpcError) as caught:
                call(stub, metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
            assert caught.value.details() == "missing or invalid bearer token", name
            assert not caught.value.trailing_metadata(), name  # no error kind, nothing about the fragment
    after = stub.Stats(pb.StatsRequest(), metadata=worker.metadata())
    assert after.fragments_started == before.fragments_started  # no rejected ticket ever ran
    assert after.refreshes_refused == before.refreshes_refused


def test_without_a_token_file_the_worker_refuses_to_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "refusing to start without authentication" in done.stderr


def test_tls_worker_serves_tls_only(worker_process_factory: WorkerFactory, tmp_path: Path) -> None:
    cert, key = _self_signed_certificate()
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    process = worker_process_factory.start(
        "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem")
    )
    try:
        health = process.stub(root_certificates=cert).Health(
            pb.HealthRequest(), metadata=process.metadata(), timeout=10
        )
        assert health.status == pb.HealthResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            process.stub().Health(pb.HealthRequest(), metadata=process.metadata(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        process.stop()


def _self_signed_certificate() -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


# ---------------------------------------------------------------------------------------------- credentials


def test_a_ticket_with_an_incomplete_credential_set_is_refused(worker: WorkerProcess, data: Fixture) -> None:
    incomplete = dataclasses.replace(data.writer_set, session_token=None)
    with pytest.raises(grpc.RpcError) as caught:
        list(worker.stub().Execute(ticket(data, [incomplete]), metadata=worker.metadata()))
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(error.trailing_metadata())[ERROR_KIND_KEY] == "invalid-ticket"
    assert f"credential set for {data.table.location()} is incomplete (missing session token)" in error.details()
    assert data.writer_set.secret_access_key not in error.details()


def test_a_worker_reads_data_files_with_no_head_and_a_refused_key_is_a_read_failure(
    worker: WorkerProcess, data: Fixture, catalog_server: CatalogServer
) -> None:
    """Workers keep data ranges too: a miss is a signed ranged GET (the manifest's size), so no data file sees a
    HEAD; a key the store refuses (403) fails the fragment as a typed read failure, as pyarrow's did."""
    from tests.e2e.test_engine_footer_cache import MotoLog

    namespace = data.ref.namespace[0]
    fresh = catalog_server.principal_with_grants(
        f"worker_fresh_{uuid.uuid4().hex[:6]}", [("TABLE_READ_DATA", namespace, None)]
    )
    fresh_set = _vended_set(catalog_server, fresh, namespace, data.table)  # no worker has kept ranges under it
    log = MotoLog(catalog_server.moto.pid)
    log.mark()
    result, _ = collect(worker.stub().Execute(ticket(data, [fresh_set]), metadata=worker.metadata()))
    assert rows(result) == rows(data.expected)
    requests = log.data_requests()
    assert {method for method, _ in requests} == {"GET"} and len({path for _, path in requests}) == FILES

    refused = dataclasses.replace(fresh_set, secret_access_key="not-the-secret-" + "q" * 25)  # same key id
    with pytest.raises(grpc.RpcError) as caught:
        list(worker.stub().Execute(ticket(data, [refused]), metadata=worker.metadata()))
    error = caught.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(error.trailing_metadata())[ERROR_KIND_KEY] == "read-failed"
    assert "HTTP 403" in error.details() and "\n" not in error.details()
    shown = error.details() + worker.log_text()
    assert refused.secret_access_key not in shown and (fresh_set.session_token or "-") not in shown


def test_a_pushed_set_is_used_for_later_files(paced_worker: WorkerProcess, data: Fixture) -> None:
    """Set A is declared to expire after ~3 files; B is pushed after the first file: every row arrives, and two
    distinct keys opened files."""
    stub = paced_worker.stub()
    wire = ticket(data, [expiring(data.writer_set, 1.8)], pace_ms=PACE_MS)
    pushes: list[pb.RefreshResponse] = []
    messages: list[pb.ExecuteResponse] = []
    for message in stub.Execute(wire, metadata=paced_worker.metadata()):
        messages.append(message)
        if message.WhichOneof("payload") == "progress" and not pushes:
            request = pb.RefreshRequest(
                query_id=wire.query_id, table=data.ref.to_proto(), credentials=[credentials_to_proto(data.reader_set)]
            )
            pushes.append(stub.RefreshCredentials(request, metadata=paced_worker.metadata()))
    assert pushes and pushes[0].accepted and pushes[0].fragments_updated == 1
    schema = decode_schema(messages[0].schema.ipc)
    result = pa.Table.from_batches(
        [decode_batch(m.batch.ipc, schema) for m in messages if m.WhichOneof("payload") == "batch"], schema=schema
    )
    assert rows(result) == rows(data.expected)
    stats = stub.Stats(pb.StatsRequest(), metadata=paced_worker.metadata())
    assert stats.credential_sets_used == 2
    assert (stats.refreshes_accepted, stats.fragments_completed, stats.files_read) == (1, 1, FILES)
    assert_no_secrets(paced_worker, data.secrets)


class _LostInTransit(grpc.RpcError):
    """What a call on a reset connection raises (``UNAVAILABLE``), without a real network fault to arrange."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


class _FirstPushLost:
    """The coordinator's real client of a worker, except that its first ``RefreshCredentials`` is lost in transit."""

    def __init__(self, client: WorkerClient) -> None:
        self.client = client
        self.calls = 0

    def refresh(self, request: pb.RefreshRequest, timeout: float) -> pb.RefreshResponse:
        self.calls += 1
        if self.calls == 1:
            raise _LostInTransit()
        return self.client.refresh(request, timeout)


def test_a_push_lost_in_transit_is_sent_again(paced_worker: WorkerProcess, data: Fixture) -> None:
    """The coordinator's pusher refreshes a fragment whose set expires after ~3 files; its first call is lost: the
    push is sent again, lands, and every row arrives (before: logged only, and the fragment failed at expiry)."""
    wire = ticket(data, [expiring(data.writer_set, 1.8)], pace_ms=PACE_MS)
    client = WorkerClient(paced_worker.address, paced_worker.token, tls_ca=None, max_message_bytes=64 << 20)
    flaky = _FirstPushLost(client)
    stats = CoordinatorStats()
    pusher = CredentialPusher({paced_worker.address: cast(WorkerClient, flaky)}, stats, rpc_timeout_seconds=5.0)
    ident = TableIdent(data.ref.warehouse, data.ref.namespace, data.ref.name)
    holder = Holder(paced_worker.address, wire.query_id, wire.fragment_id)
    messages: list[pb.ExecuteResponse] = []
    try:
        for message in paced_worker.stub().Execute(wire, metadata=paced_worker.metadata()):
            messages.append(message)
            if message.WhichOneof("payload") == "progress" and flaky.calls == 0:
                pusher.push(ident, [holder], [data.reader_set])
    finally:
        client.close()
    schema = decode_schema(messages[0].schema.ipc)
    batches = [decode_batch(m.batch.ipc, schema) for m in messages if m.WhichOneof("payload") == "batch"]
    assert rows(pa.Table.from_batches(batches, schema=schema)) == rows(data.expected)
    assert (flaky.calls, stats.pushes_sent, stats.pushes_refused) == (2, 1, 0)
    worker_stats = paced_worker.stub().Stats(pb.StatsRequest(), metadata=paced_worker.metadata())
    assert (worker_stats.refreshes_accepted, worker_stats.credential_sets_used) == (1, 2)
    assert_no_secrets(paced_worker, data.secrets)


def _expect_expired(stub: Any, wire: pb.ScanTicket, worker: WorkerProcess, data: Fixture) -> int:
    """Consume until the stream fails; assert it is the credential-expired error; return the rows received."""
    received = 0
    with pytest.raises(grpc.RpcError) as caught:
        for message in stub.Execute(wire, metadata=worker.metadata()):
            received += message.batch.num_rows
    error = caught.value
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert dict(error.trailing_metadata())[ERROR_KIND_KEY] == "credential-expired"
    prefix = data.writer_set.prefix
    assert error.details().startswith(f"credentials for {prefix} expired at ")
    assert error.details().endswith("and no refreshed set arrived")
    return received


def test_without_a_push_the_fragment_fails_at_expiry(paced_worker: WorkerProcess, data: Fixture) -> None:
    stub = paced_worker.stub()
    received = _expect_expired(
        stub, ticket(data, [expiring(data.writer_set, 1.8)], pace_ms=PACE_MS), paced_worker, data
    )
    assert 0 < received < 2 * ROWS_PER_APPEND  # the files opened in time were read, then it stopped
    stats = stub.Stats(pb.StatsRequest(), metadata=paced_worker.metadata())
    assert (stats.fragments_failed, stats.credential_expired_failures, stats.credential_sets_used) == (1, 1, 1)
    assert_no_secrets(paced_worker, data.secrets)


def test_an_incomplete_push_is_refused_and_the_current_keys_kept(paced_worker: WorkerProcess, data: Fixture) -> None:
    stub = paced_worker.stub()
    wire = ticket(data, [expiring(data.writer_set, 1.8)], pace_ms=PACE_MS)
    incomplete = dataclasses.replace(data.reader_set, session_token=None)
    responses: list[pb.RefreshResponse] = []

    def push_once_running() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            request = pb.RefreshRequest(fragment_id=wire.fragment_id, credentials=[credentials_to_proto(incomplete)])
            response = stub.RefreshCredentials(request, metadata=paced_worker.metadata())
            if "no running fragment" not in response.reason:
                responses.append(response)
                return
            time.sleep(0.05)

    pusher = threading.Thread(target=push_once_running)
    pusher.start()
    _expect_expired(stub, wire, paced_worker, data)
    pusher.join()
    (response,) = responses
    assert not response.accepted
    assert (
        response.reason
        == f"the set for {data.reader_set.prefix} is incomplete (missing session token); keeping the current keys"
    )
    stats = stub.Stats(pb.StatsRequest(), metadata=paced_worker.metadata())
    assert (stats.refreshes_refused >= 1, stats.refreshes_accepted, stats.credential_sets_used) == (True, 0, 1)


def test_scrubbed_environment_never_lends_its_keys(
    worker_process_factory: WorkerFactory, catalog_server: CatalogServer, data: Fixture
) -> None:
    """The worker starts with the catalog's own, fully privileged key in AWS_*: a ticket without a set covering the
    files fails clearly instead of reading with it."""
    moto = catalog_server.moto
    ambient = {
        "AWS_ACCESS_KEY_ID": moto.access_key_id,
        "AWS_SECRET_ACCESS_KEY": moto.secret_access_key,
        "AWS_DEFAULT_REGION": moto.region,
        "AWS_ENDPOINT_URL": moto.url,
    }
    process = worker_process_factory.start(env=ambient)
    try:
        stub = process.stub()
        assert stub.Health(pb.HealthRequest(), metadata=process.metadata()).ambient_credentials_disabled
        elsewhere = dataclasses.replace(data.writer_set, prefix=f"s3://{moto.bucket}/somewhere-else")
        for credentials in ([], [elsewhere]):
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Execute(ticket(data, credentials), metadata=process.metadata()))
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert dict(caught.value.trailing_metadata())[ERROR_KIND_KEY] == "no-credentials"
            assert caught.value.details().startswith(f"no credential set in the ticket covers {data.table.location()}/")
        assert stub.Stats(pb.StatsRequest(), metadata=process.metadata()).files_read == 0
        assert_no_secrets(process, data.secrets | {moto.secret_access_key})
    finally:
        process.stop()


# ------------------------------------------------------------------------------------------- cancel, stats


def test_cancel_stops_a_running_fragment_promptly(worker_process_factory: WorkerFactory, data: Fixture) -> None:
    process = worker_process_factory.start("--max-files-in-flight", "1")
    try:
        stub = process.stub()
        wire = ticket(data, [data.writer_set], pace_ms=2000)
        stream = stub.Execute(wire, metadata=process.metadata())
        assert next(stream).WhichOneof("payload") == "schema"
        started = time.monotonic()
        cancelled = stub.Cancel(pb.CancelRequest(query_id=wire.query_id), metadata=process.metadata())
        assert cancelled.cancelled == 1
        with pytest.raises(grpc.RpcError) as caught:
            list(stream)
        assert caught.value.code() == grpc.StatusCode.CANCELLED
        assert time.monotonic() - started < 1.5  # the 2-second pace was interrupted
        stats = stub.Stats(pb.StatsRequest(), metadata=process.metadata())
        assert (stats.fragments_cancelled, stats.fragments_running, stats.files_read) == (1, 0, 0)
        assert stub.Cancel(pb.CancelRequest(query_id=wire.query_id), metadata=process.metadata()).cancelled == 0
    finally:
        process.stop()


def test_health_and_stats(worker: WorkerProcess, data: Fixture) -> None:
    stub = worker.stub()
    health = stub.Health(pb.HealthRequest(), metadata=worker.metadata())
    assert health.status == pb.HealthResponse.SERVING
    assert health.max_message_bytes == MAX_MESSAGE_BYTES and health.ambient_credentials_disabled
    before = stub.Stats(pb.StatsRequest(), metadata=worker.metadata())
    result, _ = collect(stub.Execute(ticket(data, [data.writer_set]), metadata=worker.metadata()))
    after = stub.Stats(pb.StatsRequest(), metadata=worker.metadata())
    assert after.fragments_started - before.fragments_started == 1
    assert after.fragments_completed - before.fragments_completed == 1
    assert after.rows_sent - before.rows_sent == result.num_rows
    assert after.files_read - before.files_read == FILES
    assert after.batches_sent > before.batches_sent and after.ipc_bytes_sent > before.ipc_bytes_sent
    assert_no_secrets(worker, data.secrets)


def test_a_slow_consumer_holds_the_worker_back(worker: WorkerProcess, data: Fixture) -> None:
    """With the client's HTTP/2 window fixed at 64 KiB (no BDP growth), a paused reader stops the worker after a
    couple of messages: batches are produced as the client consumes, not buffered for the whole table."""
    stub = worker.stub(channel_options=[("grpc.http2.bdp_probe", 0)])
    before = stub.Stats(pb.StatsRequest(), metadata=worker.metadata())
    stream = stub.Execute(ticket(data, [data.writer_set]), metadata=worker.metadata())
    assert next(stream).WhichOneof("payload") == "schema"
    time.sleep(1.0)
    paused = stub.Stats(pb.StatsRequest(), metadata=worker.metadata())
    messages = list(stream)
    after = stub.Stats(pb.StatsRequest(), metadata=worker.metadata())
    total = after.batches_sent - before.batches_sent
    assert total >= 12  # ~1 MB in messages under 64 KiB
    assert paused.batches_sent - before.batches_sent <= 4
    assert sum(m.batch.num_rows for m in messages) == 2 * ROWS_PER_APPEND
