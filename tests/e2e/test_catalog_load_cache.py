"""sqe-catalog's metadata cache on the load path, against the real catalog on moto (``sqe_catalog.integrity.guard``).

Repeat loads of an unchanged table (200 and 304, plain and vended) read no metadata file from storage after the
first (no GET; one HEAD per load of a protected table confirms the stored file is the one verified), counted from
moto's own request log; a commit is served at once; a protected table's cached revision is only ever one that
passed its pin and digest check, and a file rewritten in storage after a verified load is refused (422) by the
very next load, a commit and a purge; with ``metadata_recheck_seconds`` repeat loads touch no storage at all and
a rewrite is refused once the interval has passed (never served before); with ``metadata_cache_entries = 0``
every load reads the file again, and a 304 calls no STS even with the credential cache off. The access gate still
runs before every ETag comparison.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests

from tests.conftest import catalog_variant
from tests.e2e.test_catalog_integrity import Api, assert_integrity_error, legacy_table, tamper
from tests.e2e.test_engine_footer_cache import MotoLog

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

V3 = {"format-version": "3"}
ENCRYPTED = {**V3, "encryption.key-id": "K1"}
DELEGATE = {"X-Iceberg-Access-Delegation": "vended-credentials"}
REPEATS = 6
RECHECK = 1.5  # seconds: a short real interval
# A HEAD or GET of a table metadata file (``<version>-<uuid>.metadata.json``) in moto's request log.
_METADATA_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD) (/\S+\.metadata\.json)\S* HTTP')
# An STS call (AssumeRole is a form POST to moto's root).
_STS_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*POST / HTTP')


def logged_since_mark(log: MotoLog) -> str:
    log.data_requests()  # waits for moto to write its last lines
    with log.path.open("rb") as fh:
        fh.seek(log._offset)
        return fh.read().decode("utf-8", "replace")


def metadata_requests(log: MotoLog, ns: str, method: str | None = None) -> int:
    """Metadata-file requests (``method``: only GET or only HEAD) for namespace ``ns`` since the log's mark."""
    found = _METADATA_REQUEST.findall(logged_since_mark(log))
    return sum(1 for verb, path in found if f"/{ns}/" in path and method in (None, verb))


def sts_calls(log: MotoLog) -> int:
    return len(_STS_REQUEST.findall(logged_since_mark(log)))


@pytest.fixture(scope="module")
def api(catalog_server: CatalogServer) -> Api:
    return Api(catalog_server)


def new_namespace(api: Api) -> str:
    ns = f"lc_{uuid.uuid4().hex[:8]}"
    assert api.request("POST", "namespaces", json={"namespace": [ns]}).status_code == 200
    return ns


def new_table(api: Api, properties: dict[str, str]) -> tuple[str, str]:
    """A fresh namespace with table ``t``; returns (namespace, metadata location)."""
    ns = new_namespace(api)
    created = api.create(ns, "t", properties)
    assert created.status_code == 200, created.text
    return ns, str(created.json()["metadata-location"])


def load(api: Api, ns: str, headers: dict[str, str] | None = None) -> requests.Response:
    return api.request("GET", f"namespaces/{ns}/tables/t", headers=headers or {})


def purge(api: Api, ns: str) -> requests.Response:
    return api.request("DELETE", f"namespaces/{ns}/tables/t", params={"purgeRequested": "true"})


@pytest.mark.parametrize(
    ("properties", "heads_per_load"),
    [(None, 0), ({}, 1), (V3, 1), (ENCRYPTED, 1)],
    ids=["legacy", "v2-plain", "v3-plain", "v3-encrypted"],
)
def test_repeat_loads_read_no_metadata_file_after_the_first(
    api: Api, catalog_server: CatalogServer, properties: dict[str, str] | None, heads_per_load: int
) -> None:
    if properties is None:  # a table from before integrity pins: its files are cached by location, unchecked
        ns = new_namespace(api)
        legacy_table(catalog_server, ns, "t")
    else:
        ns, _ = new_table(api, properties)
    log = MotoLog(catalog_server.moto.pid)
    log.mark()
    first = load(api, ns)
    assert first.status_code == 200
    assert metadata_requests(log, ns, "GET") == 1, "the first load reads and verifies the file"
    log.mark()
    etag = first.headers["ETag"]
    vended = load(api, ns, DELEGATE)
    for _ in range(REPEATS):
        again = load(api, ns)
        assert again.status_code == 200 and again.json() == first.json() and again.headers["ETag"] == etag
        assert load(api, ns, {"If-None-Match": etag}).status_code == 304
        revalidated = load(api, ns, {**DELEGATE, "If-None-Match": vended.headers["ETag"]})
        assert revalidated.status_code == 304
        assert api.request("GET", f"namespaces/{ns}/tables/t/credentials").status_code == 200
    assert metadata_requests(log, ns, "GET") == 0
    assert metadata_requests(log, ns, "HEAD") == heads_per_load * (1 + 4 * REPEATS), "one HEAD per protected load"


def test_a_commit_is_served_at_once(api: Api) -> None:
    ns, _ = new_table(api, V3)
    before = load(api, ns)
    assert before.status_code == 200 and load(api, ns).status_code == 200  # the revision is cached
    committed = api.set_properties(ns, "t", touched="yes")
    assert committed.status_code == 200, committed.text
    after = load(api, ns, {"If-None-Match": before.headers["ETag"]})
    assert after.status_code == 200, "the old ETag no longer matches"
    assert after.json()["metadata"]["properties"]["touched"] == "yes"
    assert after.json()["metadata-location"] == committed.json()["metadata-location"]
    assert after.json()["metadata-location"] != before.json()["metadata-location"]
    assert after.headers["ETag"] == committed.headers["ETag"] != before.headers["ETag"]


@pytest.mark.parametrize(
    ("properties", "change", "reason"),
    [
        pytest.param(
            ENCRYPTED, lambda d: d["properties"].__setitem__("owner", "mallory"), "trusted digest", id="encrypted"
        ),
        pytest.param(
            V3, lambda d: d["properties"].__setitem__("encryption.key-id", "K9"), "cannot be set", id="plaintext"
        ),
    ],
)
def test_a_file_rewritten_after_a_verified_load_is_refused_by_the_next_load(
    api: Api, catalog_server: CatalogServer, properties: dict[str, str], change: Any, reason: str
) -> None:
    ns, location = new_table(api, properties)
    assert load(api, ns).status_code == 200 and load(api, ns).status_code == 200  # verified, then cached
    etag = load(api, ns).headers["ETag"]
    tamper(catalog_server, location, change)
    assert reason in assert_integrity_error(load(api, ns))
    assert reason in assert_integrity_error(load(api, ns, {"If-None-Match": etag})), "never a 304 either"
    assert reason in assert_integrity_error(api.request("GET", f"namespaces/{ns}/tables/t/credentials"))
    assert_integrity_error(api.set_properties(ns, "t", touched="yes"))
    assert_integrity_error(purge(api, ns))


def test_a_rewrite_that_keeps_the_document_is_checked_again_and_served(api: Api, catalog_server: CatalogServer) -> None:
    ns, location = new_table(api, ENCRYPTED)
    first = load(api, ns)
    log = MotoLog(catalog_server.moto.pid)
    tamper(catalog_server, location, lambda d: None)  # indented, keys reordered: the same document
    log.mark()
    again = load(api, ns, {"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304
    assert metadata_requests(log, ns, "GET") == 1, "the changed file was read and verified again"


def test_a_new_revision_is_verified_before_it_is_served(api: Api, catalog_server: CatalogServer) -> None:
    ns, _ = new_table(api, ENCRYPTED)
    assert load(api, ns).status_code == 200  # revision 1 cached
    committed = api.set_properties(ns, "t", touched="yes")
    assert committed.status_code == 200
    tamper(catalog_server, committed.json()["metadata-location"], lambda d: d["properties"].__setitem__("x", "y"))
    assert "trusted digest" in assert_integrity_error(load(api, ns))
    assert "trusted digest" in assert_integrity_error(load(api, ns)), "a refused revision is never cached"


def test_the_access_gate_runs_before_a_cached_304(api: Api, catalog_server: CatalogServer) -> None:
    ns, _ = new_table(api, V3)
    name = f"lc_reader_{uuid.uuid4().hex[:6]}"
    reader = catalog_server.principal_with_grants(name, [("TABLE_READ_DATA", ns, None)])
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {catalog_server.token(reader)}"
    url = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/t"
    first = session.get(url, headers=DELEGATE, timeout=30)
    assert first.status_code == 200
    revalidate = {**DELEGATE, "If-None-Match": first.headers["ETag"]}
    assert session.get(url, headers=revalidate, timeout=30).status_code == 304
    catalog_server.admin_cli("revoke", f"{name}_role", "TABLE_READ_DATA", "--warehouse", "wh", "--namespace", ns)
    refused = session.get(url, headers=revalidate, timeout=30)
    assert refused.status_code == 403, refused.text
    assert "Traceback" not in refused.text


def test_with_the_caches_off_every_load_reads_and_refuses_a_rewrite_and_a_304_still_vends_nothing(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    with catalog_variant(tmp_path, catalog_server.moto, metadata_cache_entries=0, credential_cache=False) as strict:
        api = Api(strict)
        ns, location = new_table(api, ENCRYPTED)
        log = MotoLog(strict.moto.pid)
        log.mark()
        etag = load(api, ns, DELEGATE).headers["ETag"]
        assert sts_calls(log) >= 1, "a 200 with vended credentials calls STS (its cache is off)"
        log.mark()
        for _ in range(3):
            assert load(api, ns, {**DELEGATE, "If-None-Match": etag}).status_code == 304
        assert metadata_requests(log, ns, "GET") == 3, "one read per load"
        assert sts_calls(log) == 0, "a 304 vends nothing"
        tamper(strict, location, lambda d: d["properties"].__setitem__("owner", "mallory"))
        assert "trusted digest" in assert_integrity_error(load(api, ns))


def test_a_deleted_metadata_file_is_refused_by_the_next_load(api: Api, catalog_server: CatalogServer) -> None:
    ns, location = new_table(api, V3)
    assert load(api, ns).status_code == 200 and load(api, ns).status_code == 200
    bucket, _, key = location.removeprefix("s3://").partition("/")
    catalog_server.moto.client("s3").delete_object(Bucket=bucket, Key=key)
    assert "metadata file not found" in assert_integrity_error(load(api, ns))


def test_a_recheck_interval_skips_storage_and_refuses_a_rewrite_once_it_has_passed(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    with catalog_variant(tmp_path, catalog_server.moto, metadata_recheck_seconds=RECHECK) as relaxed:
        api = Api(relaxed)
        ns, location = new_table(api, ENCRYPTED)
        first = load(api, ns)  # read, verified, fingerprinted
        log = MotoLog(relaxed.moto.pid)
        log.mark()
        for _ in range(REPEATS):
            assert load(api, ns, {"If-None-Match": first.headers["ETag"]}).status_code == 304
        assert metadata_requests(log, ns) == 0, "no HEAD and no GET within the interval"
        tamper(relaxed, location, lambda d: d["properties"].__setitem__("owner", "mallory"))
        inside = load(api, ns)
        # within the interval the verified revision is served, never the rewrite (or the test was too slow)
        assert inside.status_code == 422 or inside.json()["metadata"] == first.json()["metadata"]
        assert_integrity_error(api.set_properties(ns, "t", touched="yes"))  # commits read storage at once
        time.sleep(RECHECK + 0.2)
        assert "trusted digest" in assert_integrity_error(load(api, ns))


def test_no_secret_in_the_catalog_log(api: Api, catalog_server: CatalogServer) -> None:
    ns, location = new_table(api, ENCRYPTED)
    assert load(api, ns, DELEGATE).status_code == 200
    tamper(catalog_server, location, lambda d: d["properties"].__setitem__("owner", "mallory"))
    assert_integrity_error(load(api, ns, DELEGATE))
    log = catalog_server.log_text()
    assert "integrity check failed" in log
    for secret in catalog_server.secrets:
        assert secret not in log
