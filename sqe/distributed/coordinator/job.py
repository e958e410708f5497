"""What one distributed pass over a plan is asked to return (the executor's ``record_batches`` takes a ``ScanJob``).

Held apart from ``run`` (the machinery of a pass) so the streams that start passes (``stream``, ``external``)
need only this value, not the run module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from sqe.distributed.coordinator.external import ExternalScanPlan
    from sqe.distributed.protocol.partial import PartialAggregate
    from sqe.execution.stream import QueryContext
    from sqe.planning.planner import ScanPlan
    from sqe.planning.user_filter import UserFilter


@dataclass(frozen=True)
class PartialAggregatePlan:
    """What the workers aggregate and the partial schema their streams must have (computed before any answer)."""

    spec: PartialAggregate
    schema: pa.Schema
    where: UserFilter | None = None  # the rows aggregated: those the user's simple WHERE keeps (all when None)


@dataclass(frozen=True)
class ScanJob:
    """One distributed pass over a plan. ``run`` numbers a query's passes (a self-join or a re-read starts another)
    so fragment ids stay unique. The workers send the restricted rows ``where`` keeps or, with ``partial``, the
    partial-aggregate rows of the rows the partial plan's own WHERE keeps: one filter, held in one place."""

    plan: ScanPlan | ExternalScanPlan
    context: QueryContext
    query_id: str
    run: int
    partial: PartialAggregatePlan | None = None
    where: UserFilter | None = None
    # Strings and binaries with 32-bit offsets (ScanTicket.plain_offsets): for a consumer that converts the types
    # itself (a pass-through result), so neither the workers nor the coordinator widen them first.
    plain_offsets: bool = False

    def __post_init__(self) -> None:
        if self.partial is not None and self.where is not None:
            raise ValueError("a partial aggregate's WHERE is its plan's (PartialAggregatePlan.where), not the job's")

    @property
    def user_filter(self) -> UserFilter | None:
        """The WHERE the workers run after the restrictions (None: every restricted row)."""
        return self.partial.where if self.partial is not None else self.where
