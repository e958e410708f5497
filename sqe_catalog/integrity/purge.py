"""Purge of dropped tables through persisted cleanup tasks that verify before they delete.

Order for a protected table: the drop first loads and verifies the metadata (a failure refuses the drop and
removes nothing); the table row and the pin are deleted and a cleanup task holding a copy of the trusted state is
inserted, in one transaction; the cleaner then reads the metadata file again and verifies it against that copy
before it traverses manifests or deletes anything. An integrity failure there is terminal: it is logged, the task
is kept as ``failed`` with the reason for the operator (``sqe-catalog admin list-cleanup-tasks``) and no file is
deleted. A legacy table's task carries no trusted state and purges as before, unverified.

Tasks are run by the background cleaner in the catalog server process (``sqe_catalog.integrity.cleaner``) and
by ``sqe-catalog admin run-cleanup``; a runner first claims a task (pending -> running) so that two runners
never work on one task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from sqlalchemy import Engine

from sqe._text import first_line
from sqe_catalog.errors import MetadataIntegrityError
from sqe_catalog.integrity import state as st
from sqe_catalog.integrity.admission import verify_loaded
from sqe_catalog.integrity.canonical import read_metadata_file
from sqe_catalog.integrity.state import CleanupTask, TableName

__all__ = ["DeleteFiles", "run_cleanup_task", "run_pending_tasks"]

log = logging.getLogger("sqe_catalog.integrity.purge")

# Deletes a dropped table's files given the table (for its log lines), its verified metadata, metadata location
# and the locations the catalog recorded for it at the drop (None: no record, the metadata's own locations bound
# it); returns a summary line.
DeleteFiles = Callable[[TableName, TableMetadata, str, tuple[str, ...] | None], str]

DONE, FAILED, SKIPPED = st.DONE, st.FAILED, "claimed-elsewhere"


def run_cleanup_task(engine: Engine, io: FileIO, task: CleanupTask, delete_files: DeleteFiles) -> str:
    """Claim, verify (protected tables) and purge one task; returns the task's final status."""
    if not st.claim_task(engine, task.id):
        return SKIPPED
    try:
        parsed = read_metadata_file(io, task.metadata_location)
        if task.trusted is not None:
            verify_loaded(task.table, task.trusted, task.metadata_location, parsed)
    except (MetadataIntegrityError, FileNotFoundError, ValueError) as exc:
        reason = exc.message if isinstance(exc, MetadataIntegrityError) else f"metadata unreadable: {first_line(exc)}"
        if task.trusted is None:
            log.warning("cleanup task %d of legacy table %s: %s; nothing deleted", task.id, task.table, reason)
        else:
            log.error(
                "cleanup task %d of %s failed integrity verification: %s; nothing deleted", task.id, task.table, reason
            )
        st.finish_task(engine, task.id, FAILED, reason)
        return FAILED
    try:
        recorded = st.task_locations(engine, task.id)
        summary = delete_files(task.table, parsed.metadata, task.metadata_location, recorded)
    except Exception as exc:  # a claimed task must never stay "running": record why it stopped
        reason = f"cleanup stopped: {type(exc).__name__}: {first_line(exc)}"
        log.error("cleanup task %d of %s: %s", task.id, task.table, reason)
        st.finish_task(engine, task.id, FAILED, reason)
        return FAILED
    st.finish_task(engine, task.id, DONE, summary)
    return DONE


def run_pending_tasks(
    engine: Engine, io: FileIO, warehouse: str, delete_files: DeleteFiles, persisted_before_ms: int | None = None
) -> dict[int, str]:
    """Every pending task of one warehouse (persisted before ``persisted_before_ms`` when given); failed tasks are
    never retried."""
    tasks = st.pending_tasks(engine, warehouse, persisted_before_ms)
    return {task.id: run_cleanup_task(engine, io, task, delete_files) for task in tasks}
