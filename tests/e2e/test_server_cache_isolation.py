"""The engine's caches inside one ``sqe serve`` process never carry one user's view of a table to another user,
nor a user's old view past a policy or grant change.

The world is the governed one of ``test_policies_e2e`` (reused by import): alice is an auditor (EU rows,
``show-last-4`` masks), bob is not (his own rows, ``replace-with-null`` masks). One server process serves them
all, so the footer, data-range, decoded-column and manifest caches, the FileIO pool and the identity broker are
shared; alice warms them first, then bob (and a principal without grants) query the same table.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import test_policies_e2e as policies
from tests.e2e import test_policies_server as served_policies
from tests.e2e import test_server as server_tests
from tests.e2e.test_server import Served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

world = policies.world
enabled = policies.enabled
policy_served = served_policies.policy_served
served = server_tests.served
served_distributed = server_tests.served_distributed
any_mode = server_tests.any_mode

BOB_ROWS = [
    {"id": 2, "owner": None, "region": "EU", "phone": None},
    {"id": 3, "owner": None, "region": "US", "phone": None},
]


def _query(conn: Any, sql: str) -> list[dict[str, Any]]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetch_arrow_table().to_pylist())


def _rows(conn: Any, at: Served) -> list[dict[str, Any]]:
    return _query(conn, f"SELECT id, owner, region, phone FROM {at.namespace}.orders ORDER BY id")


def _count(conn: Any, at: Served, where: str = "") -> int:
    [row] = _query(conn, f"SELECT count(*) AS n FROM {at.namespace}.orders {where}".strip())
    return int(row["n"])


@contextmanager
def _policy(world: policies.World, kind: str, *, on: bool) -> Iterator[None]:
    """The world's ``rows_``/``mask_`` policy switched ``on`` or off for the block, enabled again afterwards."""
    name = f"{kind}_{world.namespace[4:]}"
    world.api("PUT", f"/policies/{name}", {"enabled": on})
    try:
        yield
    finally:
        world.api("PUT", f"/policies/{name}", {"enabled": True})


def test_an_auditor_warms_the_caches_and_bob_still_gets_only_his_rows_and_counts(
    policy_served: Served, enabled: policies.World
) -> None:
    with policy_served.adbc("alice") as alice:
        for _ in range(2):  # the second run is served from the warmed caches
            assert [r["id"] for r in _rows(alice, policy_served)] == [1, 2, 4]
        assert _count(alice, policy_served) == 3
        assert _count(alice, policy_served, "WHERE phone LIKE '%0104'") == 1
    with policy_served.adbc("bob") as bob:
        for _ in range(2):
            assert _rows(bob, policy_served) == BOB_ROWS
        assert _count(bob, policy_served) == 2, "a bare count of a restricted table never comes from statistics"
        assert _count(bob, policy_served, "WHERE phone IS NOT NULL") == 0, "his predicates see masked values"
        assert _count(bob, policy_served, "WHERE region = 'EU'") == 1
        assert _query(bob, f"SELECT max(id) AS m FROM {policy_served.namespace}.orders") == [{"m": 3}]


def test_a_principal_without_grants_gets_nothing_from_the_warmed_caches(
    policy_served: Served, enabled: policies.World
) -> None:
    with policy_served.adbc("alice") as alice:
        assert _count(alice, policy_served) == 3
    stranger = enabled.server.create_principal(f"nogrant_{uuid.uuid4().hex[:6]}")
    with policy_served.adbc_as(stranger) as conn, pytest.raises(Exception) as err:
        _rows(conn, policy_served)
    assert "PermissionDeniedError" in str(err.value) and "Traceback" not in str(err.value), str(err.value)


def test_a_row_filter_enabled_between_two_queries_of_one_session_applies_to_the_second(
    policy_served: Served, enabled: policies.World
) -> None:
    with policy_served.adbc("bob") as bob:
        with _policy(enabled, "rows", on=False):
            assert [r["id"] for r in _rows(bob, policy_served)] == [1, 2, 3, 4, 5]
            assert _count(bob, policy_served) == 5
            assert _count(bob, policy_served) == 5  # now the count and tasks are cached for this session
        assert _rows(bob, policy_served) == BOB_ROWS, "the filter enabled meanwhile applies"
        assert _count(bob, policy_served) == 2, "no count or task list kept from the unfiltered plan"


def test_a_mask_enabled_between_two_queries_of_one_session_applies_to_the_second(
    policy_served: Served, enabled: policies.World
) -> None:
    with policy_served.adbc("bob") as bob:
        with _policy(enabled, "mask", on=False):
            phones = {r["phone"] for r in _rows(bob, policy_served)}
            assert phones == {"+44 20 7946 0002", "+1 555 0103"}
            assert _count(bob, policy_served, "WHERE phone LIKE '+44%'") == 1
        assert _rows(bob, policy_served) == BOB_ROWS, "the mask enabled meanwhile applies"
        assert _count(bob, policy_served, "WHERE phone LIKE '+44%'") == 0, "the predicate sees masked values"


def test_a_grant_revoked_between_two_queries_of_one_session_refuses_the_second(
    policy_served: Served, enabled: policies.World
) -> None:
    name = f"revokee_{uuid.uuid4().hex[:6]}"
    revokee = enabled.server.principal_with_grants(name, [("TABLE_READ_DATA", None, None)])
    with policy_served.adbc_as(revokee) as conn:
        assert _rows(conn, policy_served) == [], "his own rows: none are his"
        enabled.server.admin_cli("revoke", f"{name}_role", "TABLE_READ_DATA", "--warehouse", enabled.server.warehouse)
        with pytest.raises(Exception) as err:
            _rows(conn, policy_served)
    assert "Traceback" not in str(err.value)


def test_a_user_whose_data_grant_became_metadata_only_gets_no_count_from_the_kept_plan(served: Served) -> None:
    """A bare count answered from the session's kept tasks or manifest-list counts needs data access in this
    query: once the catalog vends no credential for the table, nothing read from its manifests is served."""
    catalog = served.catalog
    name = f"downgraded_{uuid.uuid4().hex[:6]}"
    user = catalog.principal_with_grants(name, [("NAMESPACE_LIST", None, None), ("TABLE_READ_DATA", None, None)])
    sql = f"SELECT count(*) AS n FROM {served.namespace}.numbers"
    with served.adbc_as(user) as conn:
        first = _query(conn, sql)
        assert first == _query(conn, sql) and first[0]["n"] > 0  # planned once, then from the kept plan
        _query(conn, f"SELECT count(*) AS n FROM {served.namespace}.numbers WHERE n >= 0")  # tasks kept too
        catalog.admin_cli("grant", f"{name}_role", "TABLE_READ_PROPERTIES", "--warehouse", catalog.warehouse)
        catalog.admin_cli("revoke", f"{name}_role", "TABLE_READ_DATA", "--warehouse", catalog.warehouse)
        for counted in (sql, f"SELECT count(*) AS n FROM {served.namespace}.numbers WHERE n >= 0"):
            with pytest.raises(Exception) as err:
                rows = _query(conn, counted)
                pytest.fail(f"{counted!r} answered {rows} without data access")
            assert "TABLE_READ_DATA" in str(err.value) or "credential" in str(err.value).lower(), str(err.value)


def test_a_statement_prepared_before_a_row_filter_was_enabled_runs_filtered(
    policy_served: Served, enabled: policies.World
) -> None:
    """Flight SQL prepared statements (ADBC binds parameters through one) and SQL ``PREPARE``/``EXECUTE``."""
    sql = f"SELECT id FROM {policy_served.namespace}.orders WHERE id > ? ORDER BY id"
    with policy_served.adbc("bob") as bob, bob.cursor() as cur:
        with _policy(enabled, "rows", on=False):
            cur.execute(sql, parameters=(0,))
            assert [r["id"] for r in cur.fetch_arrow_table().to_pylist()] == [1, 2, 3, 4, 5]
            cur.execute(f"PREPARE kept AS SELECT id FROM {policy_served.namespace}.orders ORDER BY id")
            cur.fetch_arrow_table()
            cur.execute("EXECUTE kept")
            assert [r["id"] for r in cur.fetch_arrow_table().to_pylist()] == [1, 2, 3, 4, 5]
        cur.execute(sql, parameters=(0,))
        assert [r["id"] for r in cur.fetch_arrow_table().to_pylist()] == [2, 3], "the same prepared statement"
        cur.execute("EXECUTE kept")
        assert [r["id"] for r in cur.fetch_arrow_table().to_pylist()] == [2, 3]


def test_restrictions_set_between_two_queries_apply_locally_and_on_the_workers(any_mode: Served) -> None:
    """An unrestricted user warms the coordinator's and the workers' caches; restrictions the catalog attaches to
    them next (``set-restrictions``) apply to their very next query, and lifting them restores the full view."""
    catalog, namespace = any_mode.catalog, any_mode.namespace
    name = f"switched_{uuid.uuid4().hex[:6]}"
    user = catalog.principal_with_grants(name, [("TABLE_READ_DATA", None, None)])
    target = ["--warehouse", catalog.warehouse, "--namespace", namespace, "--table", "people", "--principal", name]
    document = any_mode.workdir / f"{name}.json"
    document.write_text(json.dumps(server_tests.BOB), encoding="utf-8")
    sql = f"SELECT id, region, ssn FROM {namespace}.people ORDER BY id"
    everything = server_tests.PEOPLE.select(["id", "region", "ssn"]).to_pylist()
    count = f"SELECT count(*) AS n FROM {namespace}.people"
    with any_mode.adbc_as(user) as conn:
        for _ in range(2):
            assert _query(conn, sql) == everything
            assert _query(conn, count) == [{"n": 6}]
        catalog.admin_cli("set-restrictions", *target, "--file", str(document))
        try:
            assert _query(conn, sql) == server_tests.BOB_ROWS, "restricted from the next query on"
            assert _query(conn, count) == [{"n": 3}], "never the unrestricted count kept from before"
            assert _query(conn, f"SELECT count(*) AS n FROM {namespace}.people WHERE ssn IS NOT NULL") == [{"n": 0}]
        finally:
            catalog.admin_cli("clear-restrictions", *target)
        assert _query(conn, sql) == everything


def test_an_unrestricted_user_warms_the_caches_and_a_restricted_one_gets_only_their_view(any_mode: Served) -> None:
    """carol reads ``people`` unrestricted (raw ssn, every row, counts from the manifests); bob, next, through the
    same process and workers, gets his rows, his masks and counts of them only."""
    namespace = any_mode.namespace
    sql = f"SELECT id, region, ssn FROM {namespace}.people ORDER BY id"
    count = f"SELECT count(*) AS n FROM {namespace}.people"
    raw_ssn = f"SELECT count(*) AS n FROM {namespace}.people WHERE ssn LIKE '2%'"
    with any_mode.adbc("carol") as carol:
        for _ in range(2):
            assert _query(carol, sql) == server_tests.PEOPLE.select(["id", "region", "ssn"]).to_pylist()
            assert _query(carol, count) == [{"n": 6}]
            assert _query(carol, raw_ssn) == [{"n": 1}]
    with any_mode.adbc("bob") as bob:
        assert _query(bob, sql) == server_tests.BOB_ROWS
        assert _query(bob, count) == [{"n": 3}]
        assert _query(bob, raw_ssn) == [{"n": 0}], "his predicate sees the masked ssn, never the kept raw one"
        assert _query(bob, f"SELECT max(id) AS m FROM {namespace}.people") == [{"m": 5}]


def test_a_user_cannot_read_what_another_users_queries_spill(policy_served: Served) -> None:
    """Found by review: every client session's DuckDB database spilled into the server's working directory's
    ``.tmp``, which DuckDB lets SQL read whatever ``enable_external_access`` says: bob's ``read_blob('.tmp/*')``
    read the blocks alice's queries spilled (her rows, as her restrictions left them). Each database now spills
    into a directory of its own, which only its own SQL may read."""
    setting = "SELECT current_setting('temp_directory') AS d"
    with policy_served.adbc("alice") as alice, policy_served.adbc("bob") as bob:
        [hers], [his] = _query(alice, setting), _query(bob, setting)
        assert hers["d"] != his["d"], "each user's database spills into a directory of its own"
        spill = Path(hers["d"])  # the server's name: its descriptor of its private directory, /proc/self/fd/N
        server_fd = spill.parent.as_posix().replace("/proc/self/", f"/proc/{policy_served.proc.pid}/", 1)
        named = Path(os.path.realpath(server_fd)) / spill.name
        assert spill.is_absolute() and named.parent.name.startswith(".sqe-spill-")
        named.mkdir(exist_ok=True)  # DuckDB makes it on the first spill; the block below stands in for one
        block = named / "duckdb_temp_storage_DEFAULT-0.tmp"
        block.write_bytes(b"alice's spilled rows")
        try:
            listing = f"SELECT count(*) AS n FROM glob('{spill}/*')"
            assert _query(alice, listing) == [{"n": 1}], "the probe is real: alice's own SQL lists her spill"
            for probe in (listing, f"SELECT content FROM read_blob('{spill}/*')", "SELECT * FROM glob('.tmp/*')"):
                with pytest.raises(Exception, match="Permission Error"):
                    _query(bob, probe)
        finally:
            block.unlink()
            named.rmdir()
