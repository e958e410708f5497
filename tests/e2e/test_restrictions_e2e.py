"""Read-restrictions end to end: ``sqe-catalog serve`` on moto serves per-principal restrictions, SQE enforces them.

One table ``people`` written by a writer; restrictions attached with ``sqe-catalog admin set-restrictions``:

- alice: only ``region = 'EU'`` rows; ``email`` mask-alphanum, ``ssn`` replace-with-null;
- bob: only ``region`` in (US, UK); ``email`` show-last-4, ``name`` sha-256-query-local;
- carol: nothing (sees the raw table); dave: alice's restrictions, but using his own token.

SQE reads as a trusted reader: each session has the user's client credentials and the reader principal's
(``[catalog] reader_client_id/secret``) and exchanges the user's token with the reader's itself (RFC 8693), so
grants and restrictions are the user's and trust is the reader's. A user's own token never gets a restricted
table (dave). Raw HTTP checks use ``World.delegated_token``, the same exchange done by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import RESTError

import sqe.api
from sqe.config import CatalogConfig, SQEConfig, StorageConfig
from sqe.errors import PermissionDeniedError, QueryError, RestrictedTableError, RestrictionsNotSupportedError, SQEError
from sqe.session import WITHHELD, Session, explain_sections
from sqe_catalog.cli import main as catalog_cli

if TYPE_CHECKING:
    from pyiceberg.table.snapshots import Snapshot

    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

CAPABILITY = {"X-Gravitino-Client-Capabilities": "read-restrictions.v1"}
PEOPLE = pa.table(
    {
        "id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        "name": pa.array(["ada", "grace", "linus", "margaret", "alan", "tim"], pa.string()),
        "email": pa.array(
            ["ada@example.com", "grace.hopper@navy.mil", "linus@kernel.org", "mh@nasa.gov", "alan@bletchley.uk", None],
            pa.string(),
        ),
        "region": pa.array(["EU", "US", "EU", "US", "UK", "EU"], pa.string()),
        "amount": pa.array([100, 250, 75, 300, 50, 20], pa.int64()),
        "ssn": pa.array(["111-22-3333", "222-33-4444", "333-44-5555", "444-55-6666", "555-66-7777", None], pa.string()),
    }
)
# Field ids of a new table: 1 id, 2 name, 3 email, 4 region, 5 amount, 6 ssn.
ALICE = {
    "required-row-filter": {"type": "eq", "left": {"type": "reference", "id": 4}, "right": "EU"},
    "required-column-projections": [
        {"field-id": 3, "action": "mask-alphanum"},
        {"field-id": 6, "action": "replace-with-null"},
    ],
}
BOB = {
    "required-row-filter": {"type": "in", "child": {"type": "reference", "id": 4}, "values": ["US", "UK"]},
    "required-column-projections": [
        {"field-id": 3, "action": "show-last-4"},
        {"field-id": 2, "action": "sha-256-query-local"},
    ],
}


def run_admin(server: CatalogServer, *args: str) -> tuple[int, str, str]:
    """``sqe-catalog admin ARGS`` in-process: the command line's own code, minus a process start per call."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = catalog_cli(["admin", "--config", str(server.config_path), *args])
    return code, out.getvalue(), err.getvalue()


def admin_ok(server: CatalogServer, *args: str) -> str:
    code, out, err = run_admin(server, *args)
    assert code == 0, err
    return out


@dataclass
class World:
    server: CatalogServer
    namespace: str
    workdir: Path
    principals: dict[str, CatalogPrincipal]
    reader: CatalogPrincipal

    def delegated_token(self, who: str) -> str:
        """``who``'s token exchanged with the reader's: subject = the user, actor = the reader."""
        form = {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "subject_token": self.server.token(self.principals[who]),
            "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "actor_token": self.server.token(self.reader),
            "actor_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }
        reply = requests.post(f"{self.server.url}/v1/oauth/tokens", data=form, timeout=30)
        assert reply.status_code == 200, reply.text
        token = str(reply.json()["access_token"])
        self.server.secrets.add(token)
        return token

    def restrict(self, who: str, document: Any, table: str = "people") -> None:
        path = self.workdir / f"{who}-{table}.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        target = ["--warehouse", self.server.warehouse, "--namespace", self.namespace, "--table", table]
        admin_ok(
            self.server, "set-restrictions", *target, "--principal", self.principals[who].name, "--file", str(path)
        )

    def session(self, who: str, *, own_token: bool = False, **catalog: Any) -> Session:
        principal = self.principals[who]
        moto = self.server.moto
        auth: dict[str, Any] = {"client_id": principal.client_id, "client_secret": principal.client_secret}
        if not own_token:  # the engine exchanges the user's token with the reader's itself
            auth |= {"reader_client_id": self.reader.client_id, "reader_client_secret": self.reader.client_secret}
        config = SQEConfig(
            catalog=CatalogConfig(
                uri=self.server.url,
                warehouse=self.server.warehouse,
                **auth,
                access_delegation="vended-credentials",
                require_vended_credentials=True,
                **catalog,
            ),
            storage=StorageConfig(endpoint=moto.url, region=moto.region, path_style=True),
        )
        return sqe.api.connect(config)

    def rows(self, who: str, sql: str) -> list[dict[str, Any]]:
        with self.session(who) as session:
            return list(session.sql(sql.replace("{t}", f"{self.namespace}.people")).arrow().to_pylist())

    def raw_load(self, who: str, headers: dict[str, str] | None = None, *, own_token: bool = True) -> requests.Response:
        url = f"{self.server.url}/v1/{self.server.warehouse}/namespaces/{self.namespace}/tables/people"
        token = self.server.token(self.principals[who]) if own_token else self.delegated_token(who)
        return requests.get(url, headers={"Authorization": f"Bearer {token}", **(headers or {})}, timeout=30)


def _principal(server: CatalogServer, name: str, privileges: list[str]) -> CatalogPrincipal:
    """A principal with role ``<name>_role`` holding warehouse-wide ``privileges``."""
    return server.principal_with_grants(name, [(privilege, None, None) for privilege in privileges])


@pytest.fixture(scope="module")
def world(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:6]
    principals = {
        "writer": _principal(
            catalog_server, f"rw_{suffix}", ["NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA"]
        ),
        **{
            who: _principal(catalog_server, f"{who}_{suffix}", ["TABLE_READ_DATA"])
            for who in ("alice", "bob", "carol", "dave")
        },
    }
    namespace = f"restricted_{suffix}"
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        writer = _pyiceberg(catalog_server, principals["writer"])
        writer.create_namespace(namespace)
        writer.create_table((namespace, "people"), schema=PEOPLE.schema).append(PEOPLE)
        lookup = pa.table({"email": ["ada@example.com", "xxx@xxxxxxx.xxx", "linus@kernel.org", "xxxxx@xxxxxx.xxx"]})
        writer.create_table((namespace, "lookup"), schema=lookup.schema).append(lookup)
        reader_principal = catalog_server.create_principal(f"engine_{suffix}", reader=True)
        workdir = tmp_path_factory.mktemp("restrictions")
        world = World(catalog_server, namespace, workdir, principals, reader_principal)
        world.restrict("alice", ALICE)
        world.restrict("bob", BOB)
        world.restrict("dave", ALICE)
        yield world


def _pyiceberg(server: CatalogServer, principal: CatalogPrincipal) -> RestCatalog:
    return RestCatalog(
        f"pyiceberg-{principal.name}",
        uri=server.url,
        warehouse=server.warehouse,
        credential=principal.credential,
        scope="PRINCIPAL_ROLE:ALL",
        **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )


# ---------------------------------------------------------------------------------------------------------
# Different principals, different rows and masks


def test_two_users_of_one_table_see_different_rows_and_masks(world: World) -> None:
    query = "SELECT id, name, email, region, ssn FROM {t} ORDER BY id"
    assert world.rows("alice", query) == [
        {"id": 1, "name": "ada", "email": "xxx@xxxxxxx.xxx", "region": "EU", "ssn": None},
        {"id": 3, "name": "linus", "email": "xxxxx@xxxxxx.xxx", "region": "EU", "ssn": None},
        {"id": 6, "name": "tim", "email": None, "region": "EU", "ssn": None},
    ]
    bob = world.rows("bob", query)
    assert [(r["id"], r["email"], r["ssn"]) for r in bob] == [
        (2, "xxxxx.xxxxxx@xxxx.mil", "222-33-4444"),
        (4, "xx@xxxx.gov", "444-55-6666"),
        (5, "xxxx@xxxxxxxxy.uk", "555-66-7777"),
    ]
    salted = [str(r["name"]) for r in bob]
    assert all(len(h) == 64 for h in salted), "lowercase hex SHA-256"
    assert not {hashlib.sha256(n.encode()).hexdigest() for n in ("grace", "margaret", "alan")} & set(salted)
    assert world.rows("carol", "SELECT count(*) AS n, count(ssn) AS ssns FROM {t}") == [{"n": 6, "ssns": 5}]


def test_query_local_hashes_change_between_queries(world: World) -> None:
    query = "SELECT name FROM {t} WHERE region = 'US' ORDER BY id"
    first, second = world.rows("bob", query), world.rows("bob", query)
    assert len(first) == 2 and first != second, "a new salt per query"


# ---------------------------------------------------------------------------------------------------------
# User predicates, LIKE and joins see masked values only


def test_where_like_and_join_on_a_masked_column_match_masked_values_only(world: World) -> None:
    assert world.rows("alice", "SELECT id FROM {t} WHERE email = 'ada@example.com'") == []
    assert world.rows("alice", "SELECT id FROM {t} WHERE email LIKE 'ada%'") == []
    assert world.rows("alice", "SELECT id FROM {t} WHERE email LIKE '%@xxxxxxx.xxx' ORDER BY id") == [{"id": 1}]
    join = "SELECT p.id, l.email FROM {t} p JOIN {ns}.lookup l ON p.email = l.email ORDER BY p.id"
    joined = world.rows("alice", join.replace("{ns}", world.namespace))
    assert joined == [{"id": 1, "email": "xxx@xxxxxxx.xxx"}, {"id": 3, "email": "xxxxx@xxxxxx.xxx"}]
    assert len(world.rows("carol", join.replace("{ns}", world.namespace))) == 2, "raw emails join for carol"


def test_filtered_out_rows_never_influence_counts_or_aggregates(world: World) -> None:
    aggregates = (
        "SELECT count(*) AS n, CAST(sum(amount) AS BIGINT) AS total, max(amount) AS hi, min(amount) AS lo, "
        "count(DISTINCT region) AS regions FROM {t}"
    )
    assert world.rows("alice", aggregates) == [{"n": 3, "total": 195, "hi": 100, "lo": 20, "regions": 1}]
    assert world.rows("bob", aggregates) == [{"n": 3, "total": 600, "hi": 300, "lo": 50, "regions": 2}]
    grouped = world.rows("alice", "SELECT region, count(*) AS n FROM {t} GROUP BY region")
    assert grouped == [{"region": "EU", "n": 3}]
    assert world.rows("alice", "SELECT id FROM {t} WHERE region <> 'EU' OR TRUE ORDER BY id") == [
        {"id": 1},
        {"id": 3},
        {"id": 6},
    ]
    with world.session("alice") as session:
        assert session.sql(f"SELECT count(*) AS n FROM {world.namespace}.people").fetchall() == [(3,)]
        progress = session.progress()
        assert progress is not None and progress["rows_produced"] == 3, "only the visible rows leave the scan"


def test_prepared_statements_keep_the_restrictions(world: World) -> None:
    with world.session("alice") as session:
        prepared = session.prepare(f"SELECT id, email FROM {world.namespace}.people WHERE id < ? ORDER BY id")
        assert prepared.execute([4]).fetchall() == [(1, "xxx@xxxxxxx.xxx"), (3, "xxxxx@xxxxxx.xxx")]
        assert prepared.execute([100]).fetchall()[-1] == (6, None)


# ---------------------------------------------------------------------------------------------------------
# Inspection: what the session shows of a restricted table


def test_explain_and_describe_show_masks_and_the_filter_without_values(world: World) -> None:
    with world.session("alice") as session:
        explained = session.sql(f"EXPLAIN SELECT email, ssn FROM {world.namespace}.people").arrow()
        [row] = explain_sections(explained).values()
        described = session.describe_table(f"{world.namespace}.people").to_pylist()
    assert row["masked_columns"] == "email (mask-alphanum), ssn (replace-with-null)"
    assert row["row_filter"] == "applied"
    assert "EU" not in json.dumps(row, default=str), "the filter's values stay hidden"
    assert "EU" not in str(explained.to_pylist())
    masked = {r["column_name"]: r["masked"] for r in described}
    assert masked == {
        "id": "",
        "name": "",
        "email": "mask-alphanum",
        "region": "",
        "amount": "",
        "ssn": "replace-with-null",
    }


def test_metadata_tables_of_a_restricted_table_are_not_reachable(world: World) -> None:
    with world.session("alice") as session:
        for name in ('"people$files"', '"people$snapshots"', '"people.files"'):
            with pytest.raises(SQEError):
                session.sql(f"SELECT * FROM {world.namespace}.{name}").arrow()
        with pytest.raises(QueryError):
            session.sql(f"SELECT * FROM iceberg_metadata('{world.namespace}.people')").arrow()


def test_explain_of_a_row_filtered_table_reveals_no_manifest_record_count(world: World) -> None:
    with world.session("alice") as session:
        [row] = explain_sections(session.sql(f"EXPLAIN SELECT id FROM {world.namespace}.people").arrow()).values()
    assert row["records_planned"] == WITHHELD, "6 raw records would reveal how many rows are hidden"


def test_explain_of_a_row_filtered_table_reveals_nothing_pruned_with_the_users_predicates(world: World) -> None:
    """amount > 200 matches only rows alice cannot see (US), amount > 1000 no row: both must look the same."""
    with world.session("alice") as session:
        hidden_only, nothing = (
            explain_sections(session.sql(f"EXPLAIN SELECT id FROM {world.namespace}.people WHERE {p}").arrow())
            for p in ("amount > 200", "amount > 1000")
        )
        analyzed = explain_sections(
            session.sql(f"EXPLAIN ANALYZE SELECT id FROM {world.namespace}.people WHERE amount > 200").arrow()
        )
    [a], [b] = hidden_only.values(), nothing.values()
    for key in ("files_planned", "bytes_planned", "records_planned", "delete_files"):
        assert a[key] == b[key] == WITHHELD
    differ = {"pushed_filter", "cache", "credential_expires_at", "credential_usable_until"}  # not about rows
    assert {k: v for k, v in a.items() if k not in differ} == {k: v for k, v in b.items() if k not in differ}
    [scan] = [v for k, v in analyzed.items() if k != "query"]
    assert scan["scan_rows"] == "0" and scan["files_planned"] == WITHHELD  # rows it sees: none


def test_dml_on_a_restricted_table_is_refused_before_any_write(world: World) -> None:
    with world.session("alice") as session:
        for sql in (
            "DELETE FROM {t} WHERE id = 1",
            "UPDATE {t} SET amount = 0",
            "MERGE INTO {t} USING (SELECT 1 AS id) s ON people.id = s.id WHEN MATCHED THEN DELETE",
        ):
            with pytest.raises(RestrictedTableError, match="read-restrictions"):
                session.sql(sql.replace("{t}", f"{world.namespace}.people"))
    assert len(world.rows("carol", "SELECT * FROM {t}")) == 6


def test_metadata_tables_serve_an_unrestricted_reader(world: World) -> None:
    snapshots = world.rows("carol", "SELECT operation FROM " + world.namespace + '."people$snapshots"')
    assert [r["operation"] for r in snapshots] == ["append"]
    with world.session("alice") as session, pytest.raises(RestrictedTableError):
        session.sql(f'SELECT * FROM {world.namespace}."people$history"')


def _renamed_since_a_snapshot(world: World, name: str) -> Snapshot:
    """A copy of ``people`` whose ``email`` is ``contact`` since its one snapshot (returned); alice restricted."""
    writer = _pyiceberg(world.server, world.principals["writer"])
    table = writer.create_table((world.namespace, name), schema=PEOPLE.schema)
    table.append(PEOPLE)
    before = table.current_snapshot()
    assert before is not None
    with table.update_schema() as update:
        update.rename_column("email", "contact")
    world.restrict("alice", ALICE, table=name)
    return before


def test_time_travel_applies_current_restrictions_by_field_id_after_a_rename(world: World) -> None:
    before = _renamed_since_a_snapshot(world, "renamed")
    with world.session("alice") as session:
        old = (
            session.sql(
                f"SELECT id, email, ssn FROM {world.namespace}.renamed "
                f"FOR VERSION AS OF {before.snapshot_id} ORDER BY id"
            )
            .arrow()
            .to_pylist()
        )
        now = session.sql(f"SELECT id, contact FROM {world.namespace}.renamed ORDER BY id").arrow().to_pylist()
    assert [r["id"] for r in old] == [1, 3, 6]  # the current row filter, on the old snapshot
    assert old[0]["email"] == "xxx@xxxxxxx.xxx" and old[0]["ssn"] is None  # masked under its old name
    assert now[0]["contact"] == "xxx@xxxxxxx.xxx"


def test_explain_names_a_masked_column_as_the_snapshot_read_names_it(world: World) -> None:
    # Found by review: the mask follows the field id, so the old snapshot's ``email`` is masked, but EXPLAIN
    # labelled the mask with today's name ``contact``, a column the time-travel query does not have.
    before = _renamed_since_a_snapshot(world, "renamed_explained")
    name = f"{world.namespace}.renamed_explained"
    with world.session("alice") as session:
        old = session.sql(f"EXPLAIN SELECT id, email FROM {name} FOR VERSION AS OF {before.snapshot_id}").arrow()
        now = session.sql(f"EXPLAIN SELECT id, contact FROM {name}").arrow()
        travelled = session.sql(f"SELECT email FROM {name} FOR VERSION AS OF {before.snapshot_id} ORDER BY id")
        first = travelled.fetchall()[0]
    [old_row] = explain_sections(old).values()
    [now_row] = explain_sections(now).values()
    assert old_row["masked_columns"] == "email (mask-alphanum), ssn (replace-with-null)"
    assert now_row["masked_columns"] == "contact (mask-alphanum), ssn (replace-with-null)"
    assert first == ("xxx@xxxxxxx.xxx",)  # the column EXPLAIN names is the one masked


# ---------------------------------------------------------------------------------------------------------
# Delivery: capability, trust, ETags, other clients


def test_a_reader_without_the_capability_gets_a_clear_406(world: World) -> None:
    with world.session("alice", client_capabilities="") as session, pytest.raises(RestrictionsNotSupportedError) as err:
        session.sql(f"SELECT id FROM {world.namespace}.people").arrow()
    assert err.value.status == 406
    assert "read-restrictions.v1" in str(err.value) and "people" in str(err.value)
    with world.session("carol", client_capabilities="") as session:  # no restrictions: no capability needed
        assert len(session.sql(f"SELECT id FROM {world.namespace}.people").fetchall()) == 6


def test_a_restricted_users_own_token_gets_403(world: World) -> None:
    """Changed with governed access: SQE with dave's own token is not a trusted reader (was: dave marked untrusted)."""
    with world.session("dave", own_token=True) as session, pytest.raises(PermissionDeniedError) as err:
        session.sql(f"SELECT id FROM {world.namespace}.people").arrow()
    assert err.value.status == 403 and "the catalog only serves this table through a trusted reader" in str(err.value)


def test_pyiceberg_without_the_capability_gets_no_metadata_and_no_credentials(world: World) -> None:
    catalog = _pyiceberg(world.server, world.principals["alice"])
    with pytest.raises(RESTError):
        catalog.load_table((world.namespace, "people"))
    credentials = world.raw_load("alice", {"X-Iceberg-Access-Delegation": "vended-credentials"})
    assert credentials.status_code == 406 and "storage-credentials" not in credentials.text
    assert "metadata" not in credentials.json()
    url = world.raw_load("alice").url + "/credentials"
    token = world.server.token(world.principals["alice"])
    refused = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert refused.status_code == 406


def test_etags_differ_per_principal_and_a_304_never_skips_the_gate(world: World) -> None:
    alice, bob, carol = (world.raw_load(who, CAPABILITY, own_token=False) for who in ("alice", "bob", "carol"))
    assert {alice.status_code, bob.status_code, carol.status_code} == {200}
    assert alice.json()["read-restrictions"] == ALICE and "read-restrictions" not in carol.json()
    etags = {alice.headers["ETag"], bob.headers["ETag"], carol.headers["ETag"]}
    assert len(etags) == 3
    revalidate = {**CAPABILITY, "If-None-Match": alice.headers["ETag"]}
    assert world.raw_load("alice", revalidate, own_token=False).status_code == 304
    assert world.raw_load("bob", revalidate, own_token=False).status_code == 200
    assert world.raw_load("alice", {"If-None-Match": alice.headers["ETag"]}, own_token=False).status_code == 406
    assert world.raw_load("alice", revalidate).status_code == 403, "the reader's ETag never serves alice's own token"
    assert world.raw_load("dave", revalidate).status_code == 403


def test_cached_tables_pick_up_changed_restrictions_and_trust(world: World) -> None:
    """The engine revalidates its cached entry: new restrictions change the ETag, and removing the reader's status
    turns into a 403 on the next call with the same delegated token."""
    query = f"SELECT id, email FROM {world.namespace}.people ORDER BY id"
    temporary = {"required-column-projections": [{"field-id": 3, "action": "mask-to-fixed-value"}]}
    try:
        with world.session("carol") as session:
            assert session.sql(query).fetchall()[0] == (1, "ada@example.com")
            world.restrict("carol", temporary)
            assert session.sql(query).fetchall()[0] == (1, "XXXXXXXX")
            assert session.sql(query).fetchall()[0] == (1, "XXXXXXXX"), "a 304 keeps the restrictions"
            admin_ok(world.server, "set-trusted-reader", world.reader.name, "false")
            with pytest.raises(PermissionDeniedError):
                session.sql(query).arrow()
    finally:
        admin_ok(world.server, "set-trusted-reader", world.reader.name, "true")
        target = ["--warehouse", world.server.warehouse, "--namespace", world.namespace, "--table", "people"]
        admin_ok(world.server, "clear-restrictions", *target, "--principal", world.principals["carol"].name)


def test_tables_whose_dotted_names_read_alike_never_share_a_cache_entry(world: World) -> None:
    """Found by review: the metadata cache keyed a table by its namespace levels and name joined with dots, so
    ``"<ns>.q".t`` and ``<ns>."q.t"`` (both legal: a level or a name may hold a dot) shared one entry. Within
    ``metadata_revalidate_seconds`` the second table was answered with the first one's metadata, credentials and
    read-restrictions: alice got the rows of the table she had read first, under the other one's name."""
    writer = _pyiceberg(world.server, world.principals["writer"])
    dotted_namespace = f"{world.namespace}.q"
    writer.create_namespace((dotted_namespace,))
    for namespace, name, ids in ((dotted_namespace, "t", [1, 2]), (world.namespace, "q.t", [10, 20, 30])):
        rows = PEOPLE.slice(0, len(ids)).set_column(0, "id", pa.array(ids, pa.int64()))
        writer.create_table((namespace, name), schema=PEOPLE.schema).append(rows)
    world.restrict("alice", ALICE, table="q.t")  # only EU rows of the dotted name: id 10 (ada), not 20 (grace)
    first, second = f'"{dotted_namespace}".t', f'{world.namespace}."q.t"'
    with world.session("alice", metadata_revalidate_seconds=300) as session:
        assert session.sql(f"SELECT id FROM {first} ORDER BY id").fetchall() == [(1,), (2,)]
        assert session.sql(f"SELECT id, ssn FROM {second} ORDER BY id").fetchall() == [(10, None), (30, None)]
        assert session.sql(f"SELECT id FROM {first} ORDER BY id").fetchall() == [(1,), (2,)]
