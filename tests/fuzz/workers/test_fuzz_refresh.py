"""Fuzz the worker's pushed credential sets: ``RefreshCredentials`` on a real ``sqe-worker`` process over gRPC.

Arbitrary bytes and near-valid ``RefreshRequest`` messages (missing parts, empty, duplicate or odd prefixes,
zero, past or huge expiries, unknown fragment ids, static sets, huge strings) get a typed gRPC error or a
refusal with a one-line reason that names no secret; the worker stays alive and logs no traceback. No fragment
runs on this worker, so no push may ever be accepted: the completeness rule is checked before the scope.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqe.distributed.protocol._proto import worker_pb2 as pb
from tests.conftest import WorkerFactory, WorkerProcess
from tests.fuzz.checks import assert_one_line

pytestmark = [pytest.mark.e2e]

REFRESH_METHOD = "/sqe.worker.v1.Worker/RefreshCredentials"
SECRET = "fuzz-secret-VALUE-0123456789"
TOKEN = "fuzz-session-TOKEN-0123456789"
FAR_FUTURE_MS = int(time.time() * 1000) + 3_600_000
SETTINGS = settings(max_examples=40, deadline=5000)


@pytest.fixture(scope="module")
def worker(worker_process_factory: WorkerFactory) -> Iterator[WorkerProcess]:
    process = worker_process_factory.start()
    yield process
    assert process.proc.poll() is None, "the worker died during the fuzz run"
    assert "Traceback" not in process.log_text()
    assert SECRET not in process.log_text() and TOKEN not in process.log_text()
    process.stop()


def _raw_refresh(worker: WorkerProcess) -> Any:
    """RefreshCredentials taking the request as raw bytes (so unparseable messages reach the worker)."""
    channel = grpc.insecure_channel(worker.address)
    worker._channels.append(channel)
    return channel.unary_unary(
        REFRESH_METHOD, request_serializer=lambda data: data, response_deserializer=pb.RefreshResponse.FromString
    )


def _assert_alive(worker: WorkerProcess) -> None:
    health = worker.stub().Health(pb.HealthRequest(), metadata=worker.metadata(), timeout=10)
    assert health.status == pb.HealthResponse.SERVING


def _assert_refused(response: pb.RefreshResponse) -> None:
    assert not response.accepted, "a push was accepted although no fragment runs"
    assert response.fragments_updated == 0
    assert_one_line(response.reason)
    assert SECRET not in response.reason and TOKEN not in response.reason


# ------------------------------------------------------------------------------------------ strategies

prefixes = st.one_of(
    st.sampled_from(
        ["", "s3://bucket/t", "s3://bucket/t/", "S3://BUCKET/T", "s3a://bucket/t", "gs://b", "/", "s3://[b/t"]
    ),
    st.text(max_size=40),
    st.text(alphabet="s3:/[]@%\n\r\x00\u2028ab", max_size=30),  # [ ]: what urlsplit rejects as a bad IPv6 host
    st.just("s3://bucket/" + "x" * 100_000),
)
expiries = st.one_of(
    st.sampled_from([0, -1, 1, 1000, FAR_FUTURE_MS, 2**63 - 1, -(2**63)]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
credential_sets = st.builds(
    pb.CredentialSet,
    prefix=prefixes,
    access_key_id=st.sampled_from(["", "AKIAFUZZ", "k" * 50_000]),
    secret_access_key=st.sampled_from(["", SECRET]),
    session_token=st.sampled_from(["", TOKEN]),
    expires_at_ms=expiries,
    source=st.sampled_from([pb.CREDENTIAL_SOURCE_VENDED, pb.CREDENTIAL_SOURCE_STATIC, 0, 7]),
)
tables = st.one_of(
    st.none(),
    st.builds(
        pb.TableIdentifier,
        warehouse=st.text(max_size=10),
        namespace=st.lists(st.text(max_size=10), max_size=3),
        name=st.text(max_size=10),
    ),
)
ids = st.one_of(st.sampled_from(["", "q-1", "f-unknown", "a\nb"]), st.text(max_size=30))


@st.composite
def refresh_requests(draw: st.DrawFn) -> pb.RefreshRequest:
    sets = draw(st.lists(credential_sets, max_size=4))
    if sets and draw(st.booleans()):
        sets.append(sets[0])  # a duplicate prefix, the same set twice
    request = pb.RefreshRequest(query_id=draw(ids), fragment_id=draw(ids), credentials=sets)
    table = draw(tables)
    if table is not None:
        request.table.CopyFrom(table)
    return request


# --------------------------------------------------------------------------------------------- fuzzing


@SETTINGS
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_are_refused_typed(worker: WorkerProcess, data: bytes) -> None:
    call = _raw_refresh(worker)
    try:
        response = call(data, metadata=worker.metadata(), timeout=10)
    except grpc.RpcError as exc:
        # Only gRPC's own refusal of a message it cannot parse: never UNKNOWN (an exception in the handler).
        assert exc.code() == grpc.StatusCode.INTERNAL, exc
        assert_one_line(exc.details() or "")
    else:
        _assert_refused(response)


@SETTINGS
@given(request=refresh_requests())
def test_near_valid_pushes_are_refused_with_a_one_line_reason(
    worker: WorkerProcess, request: pb.RefreshRequest
) -> None:
    response = worker.stub().RefreshCredentials(request, metadata=worker.metadata(), timeout=10)
    _assert_refused(response)


def test_the_worker_survived_the_fuzzing(worker: WorkerProcess) -> None:
    _assert_alive(worker)
    stats = worker.stub().Stats(pb.StatsRequest(), metadata=worker.metadata(), timeout=10)
    assert stats.refreshes_accepted == 0
    assert stats.refreshes_refused > 0


# ------------------------------------------------------------------------------ regressions (examples)


def _complete(prefix: str, secret: str = SECRET) -> pb.CredentialSet:
    return pb.CredentialSet(
        prefix=prefix,
        access_key_id="AKIAFUZZ",
        secret_access_key=secret,
        session_token=TOKEN,
        expires_at_ms=FAR_FUTURE_MS,
        source=pb.CREDENTIAL_SOURCE_VENDED,
    )


def test_two_sets_for_one_prefix_are_refused_not_one_picked(worker: WorkerProcess) -> None:
    # Found by fuzzing: the later of two sets for the same (normalized) prefix silently won.
    sets = [_complete("s3://bucket/t"), _complete("s3://bucket/t/", secret=SECRET + "-other")]
    request = pb.RefreshRequest(fragment_id="f-1", credentials=sets)
    response = worker.stub().RefreshCredentials(request, metadata=worker.metadata(), timeout=10)
    assert not response.accepted
    assert response.reason == "two credential sets for the prefix s3://bucket/t/; keeping the current keys"


def test_a_prefix_with_a_newline_is_quoted_on_one_line(worker: WorkerProcess) -> None:
    # Found by fuzzing: a pushed prefix went verbatim into the reason and the worker log (a forged log line).
    incomplete = pb.CredentialSet(prefix="s3://b/t\nforged: accepted", access_key_id="AKIAFUZZ")
    request = pb.RefreshRequest(fragment_id="f-1", credentials=[incomplete])
    response = worker.stub().RefreshCredentials(request, metadata=worker.metadata(), timeout=10)
    assert not response.accepted
    assert response.reason.startswith("the set for 's3://b/t\\nforged: accepted' is incomplete")
    assert_one_line(response.reason)
    assert "\nforged: accepted" not in worker.log_text()


def test_an_unparseable_request_is_logged_on_one_line(worker: WorkerProcess) -> None:
    # Found by fuzzing: grpc logged a full traceback into the worker log for every corrupt message.
    with pytest.raises(grpc.RpcError) as caught:
        _raw_refresh(worker)(b"\xff\xff\xff", metadata=worker.metadata(), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    _assert_alive(worker)
    log = worker.log_text()
    assert "Exception deserializing" in log
    assert "Traceback" not in log and "DecodeError" not in log


def test_a_prefix_urlsplit_cannot_parse_is_refused_not_raised(worker: WorkerProcess) -> None:
    # Found by review: "s3://[b/t" made urlsplit raise inside the handler (UNKNOWN, a traceback in the log).
    request = pb.RefreshRequest(fragment_id="f-1", credentials=[_complete("s3://[bucket/t")])
    response = worker.stub().RefreshCredentials(request, metadata=worker.metadata(), timeout=10)
    assert not response.accepted and response.reason == "no running fragment in this scope"
    assert_one_line(response.reason)
    assert "Traceback" not in worker.log_text()
