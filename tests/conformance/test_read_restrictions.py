"""Read-restrictions conformance: every fixture of ``read_restrictions/v*/`` through the real catalog and engine.

Per fixture: its table (one per distinct schema + rows, created and appended by a writer principal with pyiceberg
and vended credentials; rows of format v3 tables through ``v3_append``) gets the fixture's restrictions for a
reader principal through ``sqe-catalog admin set-restrictions`` (the real CLI, run in-process), then an SQE
session as the reader runs the query. Error
fixtures check both sides: the catalog refuses the object on save, and, stored ``--unchecked``, the engine
refuses it with the expected typed error and returns no rows.

``mode`` selects how the engine runs: ``local`` (the session's own scans) or ``distributed`` (the same session
with two real ``sqe-worker`` processes: every scan runs as fragments on the workers, restrictions applied there).
``read_restrictions/known_gaps.json`` lists fixtures expected to fail (strict xfail).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import SecretStr
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow

import sqe.api
import sqe.errors
from sqe.config import CatalogConfig, CoordinatorConfig, SQEConfig, StorageConfig
from sqe.session import Session
from sqe_catalog.cli import main as catalog_cli
from tests.conformance.restriction_fixtures import (
    APPLICABLE,
    Fixture,
    action_coverage,
    load_fixtures,
    load_known_gaps,
    matches,
    resolve_markers,
    result_rows,
    rows_to_arrow,
)
from tests.conformance.v3_append import V3, append_v3

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, WorkerFactory

MODES = ("local", "distributed")
FIXTURES = load_fixtures()
KNOWN_GAPS = load_known_gaps()
_TABLE_REF = re.compile(r"\b(FROM|JOIN)\s+t\b", re.IGNORECASE)
_REJECTED = re.compile(r"read-restrictions rejected \((\w+)\)")


def _params() -> Iterator[Any]:
    for mode in MODES:
        for fixture in FIXTURES:
            gap = KNOWN_GAPS.get(fixture.id)
            marks = [pytest.mark.e2e]
            if gap is not None and mode in gap["modes"]:
                marks.append(pytest.mark.xfail(strict=True, reason=gap["reason"]))
            yield pytest.param(mode, fixture, id=f"{mode}:{fixture.id}", marks=marks)


# ---------------------------------------------------------------------------------------------------------
# The harness: principals, tables per schema + rows, the admin CLI, reader sessions


def admin(server: CatalogServer, *args: str) -> tuple[int, str, str]:
    """``sqe-catalog admin ARGS`` in-process (the command line's code, without a process start per call)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = catalog_cli(["admin", "--config", str(server.config_path), *args])
    return code, out.getvalue(), err.getvalue()


@dataclass
class Harness:
    server: CatalogServer
    writer: CatalogPrincipal
    reader: CatalogPrincipal  # the restricted end user
    engine: CatalogPrincipal  # the trusted reader principal acting for it
    workdir: Path
    workers: WorkerFactory
    prefix: str = field(default_factory=lambda: f"rrc_{uuid.uuid4().hex[:6]}")
    namespaces: dict[str, str] = field(default_factory=dict)  # table key -> namespace holding table ``t``
    sessions: dict[str, Session] = field(default_factory=dict)  # mode -> the reader's session

    def admin(self, *args: str) -> tuple[int, str]:
        code, _, err = admin(self.server, *args)
        return code, err

    def namespace_for(self, fixture: Fixture) -> str:
        """The namespace whose table ``t`` holds the fixture's schema and rows (created on first use)."""
        key = fixture.table_key
        if key not in self.namespaces:
            namespace = f"{self.prefix}_{key}"
            catalog = self._writer_catalog()
            catalog.create_namespace(namespace)
            expected = fixture.iceberg_schema()
            table = catalog.create_table((namespace, "t"), schema=expected)
            assert table.schema().as_struct() == expected.as_struct(), (
                f"the catalog assigned other field ids than the fixture's schema: {table.schema()}"
            )
            if fixture.rows:
                rows = rows_to_arrow(table.schema(), schema_to_pyarrow(table.schema()), fixture.rows)
                if table.format_version >= V3:
                    append_v3(table, rows)  # pyiceberg 0.12 writes no v3 manifests
                else:
                    table.append(rows)
            self.namespaces[key] = namespace
        return self.namespaces[key]

    def attach(self, namespace: str, fixture: Fixture, *, unchecked: bool = False) -> tuple[int, str]:
        target = ["--warehouse", self.server.warehouse, "--namespace", namespace, "--table", "t"]
        target += ["--principal", self.reader.name]
        path = self.workdir / f"{namespace}.json"
        text = fixture.restrictions_text
        path.write_text(text if text is not None else json.dumps(fixture.restrictions), encoding="utf-8")
        return self.admin("set-restrictions", *target, "--file", str(path), *(["--unchecked"] if unchecked else []))

    def session(self, mode: str) -> Session:
        """The reader's session for ``mode``, shared by all fixtures: each new attach changes the table's ETag
        for the reader, so every fixture's load revalidates and picks up its own restrictions."""
        if mode not in self.sessions:
            self.sessions[mode] = self._connect(mode)
        return self.sessions[mode]

    def _coordinator(self, mode: str) -> CoordinatorConfig:
        if mode == "local":
            return CoordinatorConfig()
        if mode != "distributed":
            raise ValueError(f"unknown conformance mode {mode!r}")
        token = uuid.uuid4().hex
        started = [self.workers.start(token=token) for _ in range(2)]
        addresses = tuple(f"127.0.0.1:{worker.port}" for worker in started)
        return CoordinatorConfig(workers=addresses, token=token, distributed_credentials="vended")

    def _connect(self, mode: str) -> Session:
        coordinator = self._coordinator(mode)
        moto = self.server.moto
        config = SQEConfig(
            catalog=CatalogConfig(
                uri=self.server.url,
                warehouse=self.server.warehouse,
                # Restricted tables are served only through a trusted reader acting for the end user: the
                # engine exchanges the end user's token for a delegated one itself (RFC 8693).
                client_id=self.reader.client_id,
                client_secret=SecretStr(self.reader.client_secret),
                reader_client_id=self.engine.client_id,
                reader_client_secret=SecretStr(self.engine.client_secret),
                access_delegation="vended-credentials",
                require_vended_credentials=True,
            ),
            storage=StorageConfig(endpoint=moto.url, region=moto.region, path_style=True),
            coordinator=coordinator,
        )
        session = sqe.api.connect(config)
        assert (session.distributed_executor is not None) == (mode == "distributed")
        return session

    def _writer_catalog(self) -> RestCatalog:
        return RestCatalog(
            "conformance-writer",
            uri=self.server.url,
            warehouse=self.server.warehouse,
            credential=self.writer.credential,
            scope="PRINCIPAL_ROLE:ALL",
            **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
        )


@pytest.fixture(scope="module")
def harness(
    catalog_server: CatalogServer,
    tmp_path_factory: pytest.TempPathFactory,
    worker_process_factory: WorkerFactory,
    catalog_reader: CatalogPrincipal,
) -> Iterator[Harness]:
    suffix = uuid.uuid4().hex[:6]
    writer_grants = [(p, None, None) for p in ("NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA")]
    writer = catalog_server.principal_with_grants(f"rr_writer_{suffix}", writer_grants)
    reader = catalog_server.principal_with_grants(f"rr_reader_{suffix}", [("TABLE_READ_DATA", None, None)])
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        workdir = tmp_path_factory.mktemp("conformance")
        harness = Harness(catalog_server, writer, reader, catalog_reader, workdir, worker_process_factory)
        try:
            yield harness
        finally:
            for session in harness.sessions.values():
                session.close()


# ---------------------------------------------------------------------------------------------------------
# The fixtures


@pytest.mark.parametrize(("mode", "fixture"), list(_params()))
def test_read_restrictions_fixture(mode: str, fixture: Fixture, harness: Harness) -> None:
    namespace = harness.namespace_for(fixture)
    if fixture.expected_error is not None:
        _check_error(harness, mode, fixture, namespace)
    else:
        _check_rows(harness, mode, fixture, namespace)


def _query(fixture: Fixture, namespace: str) -> str:
    return _TABLE_REF.sub(lambda m: f"{m.group(1)} {namespace}.t", fixture.query)


def _check_rows(harness: Harness, mode: str, fixture: Fixture, namespace: str) -> None:
    code, stderr = harness.attach(namespace, fixture)
    assert code == 0, f"the catalog refused the fixture's restrictions: {stderr.strip()}"
    actual = result_rows(harness.session(mode).sql(_query(fixture, namespace)).arrow())
    expected = fixture.expected["rows"]
    assert matches(expected, actual), (
        f"{fixture.id}\nexpected: {json.dumps(resolve_markers(expected), ensure_ascii=False)}\n"
        f"actual:   {json.dumps(actual, ensure_ascii=False)}"
    )


def _error_class(name: str) -> type[sqe.errors.SQEError]:
    found = getattr(sqe.errors, name, None)
    assert isinstance(found, type) and issubclass(found, sqe.errors.SQEError), f"unknown error class {name}"
    return found


def _check_error(harness: Harness, mode: str, fixture: Fixture, namespace: str) -> None:
    expected = _error_class(fixture.expected_error or "")
    code, stderr = harness.attach(namespace, fixture)
    assert code == 1, f"the catalog accepted restrictions the fixture calls invalid ({fixture.id})"
    named = _REJECTED.search(stderr)
    assert named is not None, f"the catalog's refusal names no error class: {stderr.strip()}"
    assert issubclass(_error_class(named.group(1)), expected), f"catalog: {stderr.strip()}"
    if fixture.error_stage == "save":
        return
    code, stderr = harness.attach(namespace, fixture, unchecked=True)
    assert code == 0, stderr
    with pytest.raises(sqe.errors.SQEError) as caught:
        harness.session(mode).sql(_query(fixture, namespace)).arrow()
    assert isinstance(caught.value, expected), f"engine raised {type(caught.value).__name__}: {caught.value}"
    assert str(caught.value).strip(), "the error names the problem"


# ---------------------------------------------------------------------------------------------------------
# The fixture set itself (no servers)


def test_fixture_set_covers_every_action_with_every_applicable_type() -> None:
    covered = set(action_coverage(FIXTURES))
    missing = sorted(
        (action, kind) for action, kinds in APPLICABLE.items() for kind in kinds if (action, kind) not in covered
    )
    assert missing == []


def test_fixture_ids_are_unique_and_known_gaps_name_real_fixtures() -> None:
    ids = Counter(fixture.id for fixture in FIXTURES)
    assert [name for name, count in ids.items() if count > 1] == []
    assert set(KNOWN_GAPS) <= set(ids), "a known gap names no fixture"
    assert all(set(gap["modes"]) <= set(MODES) for gap in KNOWN_GAPS.values())
