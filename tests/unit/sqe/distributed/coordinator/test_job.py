"""A ``ScanJob`` holds one filter: the partial plan's, or its own when it has no partial plan."""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pytest

from sqe.distributed.coordinator.job import PartialAggregatePlan, ScanJob
from sqe.distributed.protocol.partial import PartialAggregate
from sqe.execution.stream import QueryContext
from sqe.planning.user_filter import Condition, UserFilter

PLAN = cast(Any, object())  # the job only carries its plan
KEEP_POSITIVE = UserFilter((Condition("x", "gt", (0,)),))
KEEP_SMALL = UserFilter((Condition("x", "lt", (10,)),))


def _partial(where: UserFilter | None) -> PartialAggregatePlan:
    return PartialAggregatePlan(PartialAggregate((), (("count_star", ""),)), pa.schema([("a0", pa.int64())]), where)


def test_a_pass_through_job_runs_its_own_where() -> None:
    job = ScanJob(PLAN, QueryContext(), "q", 1, where=KEEP_POSITIVE)
    assert job.user_filter is KEEP_POSITIVE


def test_a_partial_aggregate_job_runs_its_plans_where() -> None:
    job = ScanJob(PLAN, QueryContext(), "q", 1, partial=_partial(KEEP_SMALL))
    assert job.user_filter is KEEP_SMALL
    assert ScanJob(PLAN, QueryContext(), "q", 1, partial=_partial(None)).user_filter is None


def test_a_job_cannot_hold_a_second_where_beside_its_partial_plans() -> None:
    with pytest.raises(ValueError, match=r"PartialAggregatePlan\.where"):
        ScanJob(PLAN, QueryContext(), "q", 1, partial=_partial(KEEP_SMALL), where=KEEP_POSITIVE)
