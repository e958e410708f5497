"""The coordinator's pure parts: fragments, the credential sets a ticket may carry, worker error classification."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import grpc
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import FileScanTask
from pyiceberg.typedef import Record

from sqe.catalog.base import TableIdent
from sqe.config import CatalogConfig, SQEConfig, StorageConfig
from sqe.credentials import (
    CredentialSet,
    ScopedFileIO,
    StoragePolicy,
    StorageSettings,
    parse_catalog_credentials,
    select_credential,
)
from sqe.distributed.coordinator import Fragment, TableCredentials, plan_fragments, ticket_sets
from sqe.distributed.coordinator import static_set as policy_static_set
from sqe.distributed.coordinator.credentials import check_coverage
from sqe.distributed.coordinator.failures import classify_rpc_error, worker_text
from sqe.distributed.coordinator.refresh import CredentialRefresher, Holder, RefreshedSets
from sqe.errors import (
    CredentialError,
    CredentialExpiredError,
    NoVendedCredentialsError,
    QueryResourceError,
    RestrictionError,
    WorkerError,
)

IDENT = TableIdent("wh", ("ns",), "t")
LOCATION = "s3://bucket/wh/ns/t"


def vended_sets_from_response(
    raw: dict[str, Any], location: str, cfg: SQEConfig, received_at: float, source: str
) -> RefreshedSets:
    """Parse once (``sqe.credentials``), then keep the complete sets a ticket may carry."""
    sets = parse_catalog_credentials(raw).sets
    return ticket_sets(sets, location, StoragePolicy.from_config(cfg), received_at, source)


def static_set(cfg: SQEConfig) -> CredentialSet | None:
    return policy_static_set(StoragePolicy.from_config(cfg))


def task(path: str, size: int) -> FileScanTask:
    data = DataFile.from_args(
        file_path=path, file_format=FileFormat.PARQUET, partition=Record(), record_count=1, file_size_in_bytes=size
    )
    return FileScanTask(data)


def config(**storage: Any) -> SQEConfig:
    return SQEConfig(
        catalog=CatalogConfig(uri="http://catalog", warehouse="wh", credential_max_age_seconds=600),
        storage=StorageConfig(endpoint="http://store:9000", path_style=True, **storage),
    )


def vended(prefix: str, key: str = "AKIAVENDED", expires_at_ms: int | None = 2_000_000_000_000) -> dict[str, Any]:
    keys = {"s3.access-key-id": key, "s3.secret-access-key": "vended-secret", "s3.session-token": "vended-token"}
    if expires_at_ms is not None:
        keys["s3.session-token-expires-at-ms"] = str(expires_at_ms)
    return {"prefix": prefix, "config": keys}


# ---------------------------------------------------------------------------------------------- fragments


def test_fragments_balance_bytes_and_keep_every_task_once() -> None:
    sizes = [900, 100, 100, 100, 400, 500, 300, 200, 600, 100]
    tasks = [task(f"s3://b/t/{i}.parquet", size) for i, size in enumerate(sizes)]
    fragments = plan_fragments(tasks, slots=2, max_files=3, max_bytes=10_000)
    assert len(fragments) == 4  # ceil(10 files / 3)
    assert sorted(t.file.file_path for f in fragments for t in f.tasks) == sorted(t.file.file_path for t in tasks)
    loads = [f.nbytes for f in fragments]
    assert loads == sorted(loads, reverse=True)  # largest first: the first free worker slot takes it
    assert max(loads) - min(loads) <= max(sizes)  # largest-first into the lightest: within one task of even


def test_fragments_split_by_bytes_and_give_every_slot_one() -> None:
    big = [task(f"s3://b/t/{i}.parquet", 100) for i in range(4)]
    assert len(plan_fragments(big, slots=1, max_files=10, max_bytes=150)) == 3  # ceil(400 / 150)
    assert len(plan_fragments(big, slots=3, max_files=10, max_bytes=10_000)) == 3
    assert len(plan_fragments(big[:1], slots=3, max_files=10, max_bytes=10_000)) == 1
    assert plan_fragments([], slots=2, max_files=4, max_bytes=100) == []


# -------------------------------------------------------------------------------------------- credentials


def test_vended_sets_drop_the_static_pair_and_sets_without_expiry() -> None:
    cfg = config(access_key_id="AKIASTATIC", secret_access_key="static-secret")
    raw = {
        "config": {"s3.endpoint": "http://catalog-chosen:1", "client.region": "eu-west-1"},
        "storage-credentials": [
            vended(LOCATION),
            vended("s3://bucket/other", expires_at_ms=None),
            {
                "prefix": "s3://bucket/static",
                "config": {"s3.access-key-id": "AKIASTATIC", "s3.secret-access-key": "static-secret"},
            },
        ],
    }
    found = vended_sets_from_response(raw, LOCATION, cfg, received_at=1_000.0, source="load-table")
    # issue 8: a set without expiry is not complete for a push and is never given a made-up expiry
    assert [c.prefix for c in found.credentials] == [LOCATION] and found.incomplete == 1
    assert all(c.source == "vended" and not c.missing_parts() for c in found.credentials)
    # SQE's own settings win over the catalog's, as on the local path
    assert found.credentials[0].settings == StorageSettings("http://store:9000", "eu-west-1", True)
    assert found.usable_until == found.credentials[0].expires_at_ms / 1000 - 300  # the set's usable point


@pytest.mark.parametrize(
    ("entry_prefix", "kept"),
    [
        (LOCATION, [LOCATION, "s3://"]),  # Polaris: its one entry, copied into config too
        ("s3://bucket/wh", ["s3://bucket/wh", "s3://"]),  # an entry covering the whole location
        (f"{LOCATION}/data", [f"{LOCATION}/data", "s3://"]),  # part of it
        ("s3://bucket/wh/ns/t1", ["s3://bucket/wh/ns/t1", "s3://"]),  # a neighbour, not a cover
        ("s3a://", ["s3a://"]),  # an entry for every S3 path: the config copy would be a second set for it
    ],
)
def test_config_level_keys_are_a_fallback_for_what_no_entry_covers(entry_prefix: str, kept: list[str]) -> None:
    entry = vended(entry_prefix)
    raw = {"config": {**entry["config"]}, "storage-credentials": [entry]}
    found = vended_sets_from_response(raw, LOCATION, config(), 0.0, "load-table")
    # As on the local path, config's keys serve every S3 path no entry covers, inside the location or not; a
    # worker refuses a ticket with two sets for one prefix, so the config copy never becomes a second "s3://" one.
    assert sorted(c.prefix or "" for c in found.credentials) == sorted(kept)


@pytest.mark.parametrize("mode", ["auto", "vended"])
def test_a_worker_reads_each_file_with_the_set_the_local_path_uses(mode: str) -> None:
    # Polaris-shaped: a config-level set and a location entry (other keys). A file outside the table location (a
    # migrated table's, another bucket) is read locally with config's keys; a worker took the [storage] pair in
    # "auto" and failed in "vended".
    cfg = config(access_key_id="AKIASTATIC", secret_access_key="static-secret")
    policy = StoragePolicy.from_config(cfg)
    raw = {"config": vended("unused", key="AKIACONFIG")["config"], "storage-credentials": [vended(LOCATION)]}
    local = ScopedFileIO.from_response(raw, policy, location=LOCATION)
    found = vended_sets_from_response(raw, LOCATION, cfg, 0.0, "load-table")
    static = policy_static_set(policy) if mode == "auto" else None
    paths = [f"{LOCATION}/data/a.parquet", "s3://bucket/wh/ns/t10/b.parquet", "s3a://other/x/c.parquet"]
    tasks = [task(path, 1) for path in paths]
    check_coverage(IDENT, tasks, found, static, mode, False)
    sets = TableCredentials(IDENT, None, found.credentials, static).for_tasks(tasks, found.credentials)
    assert all(s.source == "vended" for s in sets)
    for path in paths:
        chosen = select_credential(path, sets)
        assert chosen is not None
        assert chosen.access_key_id == local.resolve(path).properties["s3.access-key-id"]
    assert select_credential(paths[1], sets).access_key_id == "AKIACONFIG"  # type: ignore[union-attr]


@pytest.mark.parametrize("static_pair", [True, False])
def test_after_a_refresh_without_config_keys_a_file_only_they_covered_never_takes_other_keys(
    static_pair: bool,
) -> None:
    # Polaris-shaped: load-table sends config keys (every S3 path) and a location entry; its credentials endpoint
    # answers with the entry only. A later ticket for a file outside the location got the [storage] pair (auto)
    # where the local path fails the read (ScopedFileIO): it must fail the same way, never switch keys.
    storage = {"access_key_id": "AKIASTATIC", "secret_access_key": "static-secret"} if static_pair else {}
    cfg = config(**storage)
    policy = StoragePolicy.from_config(cfg)
    raw = {"config": vended("unused", key="AKIACONFIG")["config"], "storage-credentials": [vended(LOCATION)]}
    loaded = vended_sets_from_response(raw, LOCATION, cfg, 0.0, "load-table")
    answer = {"storage-credentials": [vended(LOCATION, key="AKIAFRESH", expires_at_ms=2_000_000_100_000)]}

    def reload() -> RefreshedSets:
        return vended_sets_from_response(answer, LOCATION, cfg, 0.0, "credentials-endpoint")

    refresher = CredentialRefresher(lambda *_: None, background=False)
    lease = refresher.lease("client:u", IDENT, loaded.credentials, loaded.usable_until, reload)
    table = TableCredentials(IDENT, lease, (), policy_static_set(policy))
    outside, inside = task("s3://bucket/elsewhere/a.parquet", 1), task(f"{LOCATION}/data/b.parquet", 1)
    holder = Holder("127.0.0.1:1", "q", "q.1.f0.a1")
    before, _ = refresher.register(lease, holder)
    assert [s.access_key_id for s in table.for_tasks([outside], before)] == ["AKIACONFIG", "AKIAVENDED"]
    refresher.refresh_now(lease)
    after, generation = refresher.register(lease, holder)
    assert generation == 1 and [s.access_key_id for s in after] == ["AKIAFRESH"]
    assert [s.access_key_id for s in table.for_tasks([inside], after)] == ["AKIAFRESH"]  # still read
    with pytest.raises(CredentialError, match="earlier credentials covered") as raised:
        table.for_tasks([inside, outside], after)
    assert "s3://bucket/elsewhere/a.parquet" in str(raised.value) and "secret" not in str(raised.value)
    # A newer load (a later query) is the catalog's current answer again: its config keys serve the file.
    newer = vended_sets_from_response(raw, LOCATION, cfg, 0.0, "load-table")
    refresher.lease("client:u", IDENT, newer.credentials, (lease.usable_until or 0) + 1, reload)
    again, _ = refresher.register(lease, holder)
    assert "AKIACONFIG" in [s.access_key_id for s in table.for_tasks([outside], again)]


def test_a_delete_file_no_vended_set_covers_is_seen_before_the_worker_opens_it() -> None:
    # The data file is inside the table's entry, its position-delete file is not (written by another engine
    # under another prefix): "auto" must give the ticket the [storage] pair, "vended" must fail naming it.
    deletes = "s3://bucket/elsewhere/deletes.parquet"
    deleted = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=deletes,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=1,
    )
    scan = FileScanTask(task(f"{LOCATION}/data/a.parquet", 1).file, delete_files={deleted})
    sets = vended_sets_from_response({"storage-credentials": [vended(LOCATION)]}, LOCATION, config(), 0.0, "x")
    static = static_set(config(access_key_id="AKIASTATIC", secret_access_key="static-secret"))
    assert TableCredentials(IDENT, None, sets.credentials, static).for_tasks([scan], sets.credentials)[-1] is static
    with pytest.raises(NoVendedCredentialsError, match=f"covering {deletes}"):
        check_coverage(IDENT, [scan], sets, None, "vended", True)


def test_a_vended_set_without_session_token_is_incomplete() -> None:
    entry = vended(LOCATION)
    del entry["config"]["s3.session-token"]
    found = vended_sets_from_response({"storage-credentials": [entry]}, LOCATION, config(), 0.0, "load-table")
    assert found.credentials == () and found.incomplete == 1


@pytest.mark.parametrize("where", ["storage-credentials", "config"])
def test_the_vended_mode_error_names_the_parts_the_completeness_rule_reports(where: str) -> None:
    entry = vended(LOCATION, expires_at_ms=None)
    raw = {"storage-credentials": [entry]} if where == "storage-credentials" else {"config": entry["config"]}
    found = vended_sets_from_response(raw, LOCATION, config(), 0.0, "load-table")
    inside = f"{LOCATION}/data/a.parquet"
    with pytest.raises(NoVendedCredentialsError) as raised:
        check_coverage(IDENT, [task(inside, 1)], found, None, "vended", True)
    assert f"the credential set the catalog vended for {inside} is incomplete (missing expiry)" in str(raised.value)
    assert "vended-secret" not in str(raised.value) and "vended-token" not in str(raised.value)
    outside = "s3://bucket/elsewhere/b.parquet"
    with pytest.raises(NoVendedCredentialsError) as raised:
        check_coverage(IDENT, [task(outside, 1)], found, None, "vended", True)
    if where == "config":  # config's keys cover every S3 path no entry covers, as on the local path
        assert f"vended for {outside} is incomplete (missing expiry)" in str(raised.value)
    else:
        rule = "access key id, secret access key, session token, expiry"
        assert f"no complete credential set ({rule}) covering {outside}" in str(raised.value)


def test_the_static_set_goes_only_to_fragments_with_uncovered_files() -> None:
    static = static_set(config(access_key_id="AKIASTATIC", secret_access_key="static-secret"))
    assert static is not None and static.source == "static" and static.prefix == "s3://"
    sets = vended_sets_from_response({"storage-credentials": [vended(LOCATION)]}, LOCATION, config(), 0.0, "x")
    table = TableCredentials(IDENT, None, sets.credentials, static)
    inside = Fragment(0, (task(f"{LOCATION}/data/a.parquet", 1),))
    outside = Fragment(1, (task(f"{LOCATION}/data/b.parquet", 1), task("s3://bucket/t10/c.parquet", 1)))
    assert table.for_fragment(inside, sets.credentials) == list(sets.credentials)
    assert table.for_fragment(outside, sets.credentials) == [*sets.credentials, static]
    assert static_set(config()) is None


def test_credential_reprs_hide_every_secret() -> None:
    cred = CredentialSet(LOCATION, "AKIAKEYID", "s3cr3t-value", "t0k3n-value", 1, "vended")
    text = repr(cred) + repr(TableCredentials(IDENT, None, (cred,), None))
    assert "s3cr3t-value" not in text and "t0k3n-value" not in text and "AKIAKEYID" not in text


# ------------------------------------------------------------------------------------------------- errors


class FakeRpcError(grpc.RpcError):  # type: ignore[misc]  # grpc ships no type hints
    def __init__(self, code: grpc.StatusCode, kind: str | None = None, details: str = "detail") -> None:
        self._code, self._kind, self._details = code, kind, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("sqe-error-kind", self._kind),) if self._kind else ()


@pytest.mark.parametrize(
    ("code", "kind", "fatal", "dead"),
    [
        (grpc.StatusCode.FAILED_PRECONDITION, "credential-expired", CredentialExpiredError, False),
        (grpc.StatusCode.FAILED_PRECONDITION, "restriction", RestrictionError, False),
        (grpc.StatusCode.INVALID_ARGUMENT, "invalid-ticket", WorkerError, False),
        (grpc.StatusCode.UNAUTHENTICATED, None, WorkerError, False),
        (grpc.StatusCode.UNAVAILABLE, None, None, True),  # the connection: the worker is gone
        (grpc.StatusCode.DEADLINE_EXCEEDED, None, None, True),
        (grpc.StatusCode.UNAVAILABLE, "read-failed", None, False),  # the store failed: retry elsewhere
        (grpc.StatusCode.INTERNAL, "internal", None, False),
        # past its DuckDB limits: every worker lends the same, so the query fails at once (not busy, not retried)
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "resource-limit", QueryResourceError, False),
    ],
)
def test_worker_errors_are_fatal_or_retryable(
    code: grpc.StatusCode, kind: str | None, fatal: type[Exception] | None, dead: bool
) -> None:
    failure = classify_rpc_error(FakeRpcError(code, kind), "127.0.0.1:1", "q.1.f0.a1", timed_out=False)
    assert (type(failure.fatal) if failure.fatal else None) is fatal
    assert failure.worker_dead is dead


def test_a_silent_worker_counts_as_dead_and_busy_is_not_a_failure() -> None:
    silent = classify_rpc_error(FakeRpcError(grpc.StatusCode.CANCELLED), "w:1", "f", timed_out=True)
    assert silent.worker_dead and silent.fatal is None and "stopped answering" in silent.message
    busy = classify_rpc_error(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy"), "w:1", "f", timed_out=False)
    assert busy.busy and busy.fatal is None and not busy.worker_dead


def test_a_workers_text_is_repeated_without_the_secrets_it_was_sent_even_encoded_or_cut_short() -> None:
    # a buggy or hostile worker may quote its ticket's keys as a URL carries them, or a token cut to a length
    secret, token = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "FwoGZXIvYXdzEXAMPLE+session/token=="
    said = f"refusing ?X-Amz-Security-Token={quote(token, safe='')} key {secret[:24]}"
    text = worker_text(said, {secret, token})
    assert secret[:16] not in text and quote(token, safe="")[:16] not in text
    assert text == "refusing ?X-Amz-Security-Token=*** key [redacted]"  # first_line blanks that parameter too
