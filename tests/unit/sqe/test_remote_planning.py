"""``sqe.planning.remote``: the plan status machine (completed, submitted then polled, failed, cancelled, plan
tasks) against a scripted catalog speaking the REST spec's JSON, and the switch-on-but-not-offered refusal."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, In, Not, NotEqualTo, NotIn, Or

from sqe.catalog.base import TableIdent
from sqe.catalog.rest import RestTableProvider
from sqe.config import SQEConfig, load_config
from sqe.errors import NoSuchTableError, PermissionDeniedError, RemotePlanningError
from sqe.planning.planner import join_conjuncts
from sqe.planning.remote import RemotePlanner, collect_tasks, plan_request
from sqe.vocabulary import MAX_PLAN_FILTER_PREDICATES, MAX_PLAN_FILTER_VALUES
from tests.unit.sqe.iceberg_local import LocalProvider

IDENT = TableIdent("wh", ("ns",), "t")


def _file(path: str) -> dict[str, Any]:
    return {
        "content": "data",
        "file-path": path,
        "file-format": "parquet",
        "spec-id": 0,
        "partition": [],
        "file-size-in-bytes": 10,
        "record-count": 2,
    }


class ScriptedCatalog:
    """Answers plan calls from a script; records every call."""

    def __init__(self, submit: Mapping[str, Any], polls: list[Mapping[str, Any]], tasks: Mapping[str, Any]) -> None:
        self.submit, self.polls, self.tasks = submit, list(polls), dict(tasks)
        self.calls: list[tuple[str, str]] = []

    def submit_plan(self, ident: TableIdent, request: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls.append(("submit", ""))
        return self.submit

    def fetch_plan(self, ident: TableIdent, plan_id: str) -> Mapping[str, Any]:
        self.calls.append(("poll", plan_id))
        return self.polls.pop(0)

    def fetch_plan_tasks(self, ident: TableIdent, plan_task: str) -> Mapping[str, Any]:
        self.calls.append(("tasks", plan_task))
        return self.tasks[plan_task]

    def cancel_plan(self, ident: TableIdent, plan_id: str) -> None:
        self.calls.append(("cancel", plan_id))


def test_completed_plan_with_plan_tasks_collects_every_file() -> None:
    catalog = ScriptedCatalog(
        {
            "status": "completed",
            "plan-id": "p",
            "file-scan-tasks": [{"data-file": _file("s3://b/1")}],
            "plan-tasks": ["p.1"],
        },
        [],
        {
            "p.1": {"file-scan-tasks": [{"data-file": _file("s3://b/2")}], "plan-tasks": ["p.2"]},
            "p.2": {"file-scan-tasks": [{"data-file": _file("s3://b/3")}]},
        },
    )
    planned = collect_tasks(catalog, IDENT, {}, deadline_seconds=5, sleep=lambda _s: None)
    assert [t.file.file_path for t in planned.tasks] == ["s3://b/1", "s3://b/2", "s3://b/3"]
    assert planned.storage_credentials is None
    assert catalog.calls == [("submit", ""), ("tasks", "p.1"), ("tasks", "p.2")]


def test_submitted_plan_is_polled_until_completed_and_keeps_its_credentials() -> None:
    credentials = [{"prefix": "s3://b/", "config": {"s3.access-key-id": "AKIA", "s3.secret-access-key": "x"}}]
    catalog = ScriptedCatalog(
        {"status": "submitted", "plan-id": "slow"},
        [
            {"status": "submitted", "plan-id": "slow"},
            {
                "status": "completed",
                "plan-id": "slow",
                "file-scan-tasks": [{"data-file": _file("s3://b/1")}],
                "storage-credentials": credentials,
            },
        ],
        {},
    )
    pauses: list[float] = []
    planned = collect_tasks(catalog, IDENT, {}, deadline_seconds=5, sleep=pauses.append)
    assert [t.file.file_path for t in planned.tasks] == ["s3://b/1"]
    assert planned.storage_credentials == credentials
    assert catalog.calls == [("submit", ""), ("poll", "slow"), ("poll", "slow")]
    assert len(pauses) == 2 and pauses[1] > pauses[0]  # backs off between polls


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"status": "failed", "error": {"message": "disk on fire\nsecond line", "type": "X", "code": 500}}, "failed"),
        ({"status": "cancelled"}, "cancelled"),
        ({"status": "completed", "file-scan-tasks": [{"data-file": {"file-path": 3}}]}, "not valid"),
        ({"status": "thinking"}, "not valid"),
        ({"status": "submitted"}, "without a plan-id"),
    ],
)
def test_failed_cancelled_or_malformed_plans_are_typed_one_line_errors(answer: dict[str, Any], message: str) -> None:
    with pytest.raises(RemotePlanningError, match=message) as caught:
        collect_tasks(ScriptedCatalog(answer, [], {}), IDENT, {}, deadline_seconds=5, sleep=lambda _s: None)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("error_type", "code", "expected"),
    [("NoSuchTableException", 404, NoSuchTableError), ("ForbiddenException", 403, PermissionDeniedError)],
)
def test_a_failed_plan_of_a_known_error_type_is_that_typed_error(
    error_type: str, code: int, expected: type[Exception]
) -> None:
    """The failed plan's ErrorModel goes through the catalog's one translator, keyed by its type."""
    answer = {"status": "failed", "error": {"message": "gone\nsecond line", "type": error_type, "code": code}}
    with pytest.raises(expected, match="planning") as caught:
        collect_tasks(ScriptedCatalog(answer, [], {}), IDENT, {}, deadline_seconds=5, sleep=lambda _s: None)
    assert not isinstance(caught.value, RemotePlanningError) and "\n" not in str(caught.value)


def test_a_plan_pending_past_the_deadline_is_cancelled_and_refused() -> None:
    pending = {"status": "submitted", "plan-id": "never"}
    catalog = ScriptedCatalog(pending, [pending] * 50, {})
    with pytest.raises(RemotePlanningError, match="did not finish"):
        collect_tasks(catalog, IDENT, {}, deadline_seconds=0, sleep=lambda _s: None)
    assert catalog.calls[-1] == ("cancel", "never")


def test_the_request_carries_snapshot_columns_and_filter() -> None:
    body = plan_request(EqualTo("region", "EU"), ["id", "region"], 42)
    assert body["snapshot-id"] == 42 and body["select"] == ["id", "region"] and body["case-sensitive"] is True
    assert body["filter"]["type"] == "eq" and body["filter"]["term"] == "region"
    assert "filter" not in plan_request(AlwaysTrue(), ["id"], None) and "snapshot-id" not in plan_request(
        AlwaysTrue(), [], None
    )


def test_a_filter_listing_more_values_than_the_catalog_takes_is_left_out() -> None:
    """The catalog refuses a plan filter whose in/not-in predicates list more than MAX_PLAN_FILTER_VALUES values;
    a filter only prunes, so the engine plans without it rather than failing the query."""
    half = MAX_PLAN_FILTER_VALUES // 2
    within = And(In("id", set(range(half))), Or(EqualTo("region", "EU"), Not(NotIn("id", set(range(-half, 0))))))
    assert plan_request(within, ["id"], None)["filter"]["type"] == "and"
    past = And(EqualTo("region", "EU"), Not(In("id", set(range(MAX_PLAN_FILTER_VALUES + 1)))))
    body = plan_request(past, ["id", "region"], 7)
    assert "filter" not in body and body["select"] == ["id", "region"] and body["snapshot-id"] == 7


def _or_of_equalities(values: list[int]) -> BooleanExpression:
    """A balanced or-tree of ``id = value`` predicates: 2 * len(values) - 1 nodes."""
    if len(values) == 1:
        return EqualTo("id", values[0])
    half = len(values) // 2
    return Or(_or_of_equalities(values[:half]), _or_of_equalities(values[half:]))


def test_a_filter_with_more_predicates_than_the_catalog_takes_is_left_out() -> None:
    """Found by review: the catalog also refuses a filter of more than MAX_PLAN_FILTER_PREDICATES predicates
    (and/or/not included), which lists no in/not-in value; the engine plans without such a filter."""
    within = _or_of_equalities(list(range((MAX_PLAN_FILTER_PREDICATES + 1) // 2)))  # 2 * leaves - 1 nodes
    assert plan_request(within, ["id"], None)["filter"]["type"] == "or"
    past = And(EqualTo("region", "EU"), within)
    body = plan_request(past, ["id", "region"], 7)
    assert "filter" not in body and body["select"] == ["id", "region"] and body["snapshot-id"] == 7


def test_a_filter_nested_deeper_than_the_catalog_takes_is_left_out() -> None:
    """Found by review: pydantic cannot serialise a filter some 250 levels deep and the catalog refuses one about
    140 deep; a filter only prunes, so the engine plans without one that is still deeper than 64 levels once its
    chains of and/or are balanced (here and and or alternate, so no chain is longer than two)."""
    for count in (150, 300):
        deep: BooleanExpression = EqualTo("id", 0)
        for i in range(1, count):
            deep = And(deep, NotEqualTo("id", i)) if i % 2 else Or(deep, EqualTo("id", i))
        body = plan_request(deep, ["id"], 7)
        assert "filter" not in body and body["select"] == ["id"] and body["snapshot-id"] == 7


def test_a_long_chain_of_conjuncts_is_sent_as_a_balanced_tree() -> None:
    """Found by review: conjuncts join left-deep, one level each, so a filter of 65 or more conjuncts was left out
    (no pruning at all) though the same conjuncts joined as a balanced tree nest 7 levels deep."""
    for count in (32, 150, 499):
        body = plan_request(join_conjuncts([NotEqualTo("id", i) for i in range(count)]), ["id"], None)
        assert body["filter"]["type"] == "and"
        leaves, deepest, pending = [], 0, [(body["filter"], 1)]
        while pending:
            node, depth = pending.pop()
            deepest = max(deepest, depth)
            if node["type"] == "and":
                pending += [(node["left"], depth + 1), (node["right"], depth + 1)]
            else:
                leaves.append(node["value"])
        assert sorted(leaves) == list(range(count)) and deepest == 1 + math.ceil(math.log2(count))


def test_switched_on_without_the_endpoints_never_falls_back(provider: LocalProvider) -> None:
    loaded = provider.load_table(TableIdent("wh", ("ns",), "numbers"))
    with pytest.raises(RemotePlanningError, match="does not advertise") as caught:
        RemotePlanner(provider).plan(loaded, row_filter=AlwaysTrue(), selected=["id"], snapshot_id=None)
    assert "server_side_planning" in str(caught.value)


class _EndlessTasks(ScriptedCatalog):
    """Each plan task names another (or itself): a catalog that never runs out of plan tasks."""

    def __init__(self, *, same: bool) -> None:
        super().__init__({"status": "completed", "plan-id": "p", "plan-tasks": ["p.0"]}, [], {})
        self.same = same

    def fetch_plan_tasks(self, ident: TableIdent, plan_task: str) -> Mapping[str, Any]:
        self.calls.append(("tasks", plan_task))
        assert len(self.calls) < 1000, "the client kept following plan tasks"
        following = plan_task if self.same else f"p.{len(self.calls)}"
        return {"file-scan-tasks": [{"data-file": _file(f"s3://b/{len(self.calls)}")}], "plan-tasks": [following]}


@pytest.mark.parametrize("same", [True, False])
def test_plan_tasks_that_never_end_are_refused(same: bool) -> None:
    """A plan task that names itself again, or a chain of them past the deadline, is a typed error, not a hang."""
    deadline = 60 if same else 0  # the chain: every plan task is fetched past a deadline already reached
    with pytest.raises(RemotePlanningError, match="plan tasks"):
        collect_tasks(_EndlessTasks(same=same), IDENT, {}, deadline_seconds=deadline, sleep=lambda _s: None)


def _vector(referenced: str, offset: int, size: int, positions: int) -> dict[str, Any]:
    return {
        **_file("s3://b/dv.puffin"),
        "content": "position-deletes",
        "file-format": "puffin",
        "record-count": positions,
        "referenced-data-file": referenced,
        "content-offset": offset,
        "content-size-in-bytes": size,
    }


def _completed(tasks: list[dict[str, Any]], deletes: list[dict[str, Any]]) -> ScriptedCatalog:
    body = {"status": "completed", "plan-id": "p", "file-scan-tasks": tasks, "delete-files": deletes}
    return ScriptedCatalog(body, [], {})


def test_deletion_vectors_of_a_plan_keep_their_offsets_sizes_and_data_files() -> None:
    # Before: pyiceberg's conversion read delete files as v2 records (no referenced data file, offset or size)
    # and kept one per path: the read held no blob to what the plan stated.
    from sqe.execution.delete_limits import VectorEntry, task_vector_entries

    deletes = [_vector("s3://b/1", 4, 40, 2), _vector("s3://b/2", 44, 50, 3)]
    tasks = [
        {"data-file": _file("s3://b/1"), "delete-file-references": [0, 1]},  # the other file's vector is dropped
        {"data-file": _file("s3://b/2"), "delete-file-references": [1]},
    ]
    planned = collect_tasks(_completed(tasks, deletes), IDENT, {}, deadline_seconds=5, sleep=lambda _s: None)
    assert [len(task.delete_files) for task in planned.tasks] == [1, 1]
    assert task_vector_entries(planned.tasks) == {
        "s3://b/dv.puffin": {"s3://b/1": VectorEntry(4, 40, 2), "s3://b/2": VectorEntry(44, 50, 3)}
    }


class _FailingPlanCatalog(BaseHTTPRequestHandler):
    """A catalog whose failed scan plan (a 200 answer with an ErrorModel) quotes the bearer token it was sent."""

    def do_GET(self) -> None:  # /v1/config
        endpoints = [
            f"POST /v1/{{prefix}}/namespaces/{{namespace}}/tables/{{table}}/{tail}" for tail in ("plan", "tasks")
        ]
        self._send({"defaults": {}, "overrides": {"prefix": "wh"}, "endpoints": endpoints})

    def do_POST(self) -> None:  # .../plan
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        error = {"message": f"cannot plan for token {token}", "type": "ServiceFailureException", "code": 500}
        self._send({"status": "failed", "error": error})

    def _send(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


# A delegated token as sqe-catalog issues them: base64url JSON, a dot, a base64url HMAC.
DELEGATED = "eyJhY3QiOnsic3ViIjoic3FlLWVuZ2luZSJ9LCJzdWIiOiJhbmFseXN0In0.c2lnbmF0dXJlLW9mLXRoZS1jYXRhbG9n"


def test_a_failed_plan_never_quotes_the_bearer_token_the_request_carried() -> None:
    """Found by review: error answers have the request's bearer token blanked out (``error_for_status``), but a
    failed scan plan is a 200 answer whose ErrorModel message went into the error as the catalog wrote it. In
    ``sqe serve`` the token is the user's delegated one: with it they could load their restricted tables at the
    catalog directly, raw credentials included."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FailingPlanCatalog)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    overrides = {"catalog.uri": f"http://127.0.0.1:{server.server_port}", "catalog.warehouse": "wh"}
    config = load_config(env={}, overrides={**overrides, "catalog.token": DELEGATED, "catalog.max_retries": 0})
    assert isinstance(config, SQEConfig)
    provider = RestTableProvider(config)
    try:
        planning = provider.scan_planning("wh")
        assert planning is not None
        with pytest.raises(RemotePlanningError) as failed:
            collect_tasks(planning, IDENT, {}, deadline_seconds=5, sleep=lambda _s: None)
    finally:
        provider.close()
        server.shutdown()
        server.server_close()
    shown = f"{failed.value} {failed.value!r}"
    assert "cannot plan for token" in shown and DELEGATED not in shown and DELEGATED[:40] not in shown, shown
