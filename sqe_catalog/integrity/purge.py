"""Purge of dropped tables through persisted cleanup tasks that verify before they delete.

Order for a protected table: the drop first loads and verifies the metadata (a failure refuses the drop and
removes nothing); the table row and the pin are deleted and a cleanup task holding a copy of the trusted state is
inserted, in one transaction; the cleaner then reads the metadata file again and verifies it against that copy
before it traverses manifests or deletes anything. An integrity failure there is terminal: it is logged, the task
is kept as ``failed`` with the reason for the operator (``sqe-catalog admin list-cleanup-tasks``) and no file is
deleted. A legacy table's task carries no trusted state and purges as before, unverified.
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
from sqe_catalog.integrity.state import CleanupTask

__all__ = ["DeleteFiles", "run_cleanup_task", "run_pending_tasks"]

log = logging.getLogger("sqe_catalog.integrity.purge")

# Deletes a dropped table's files given its verified metadata and metadata location; returns a summary line.
DeleteFiles = Callable[[TableMetadata, str], str]

DONE, FAILED = "done", "failed"


def run_cleanup_task(engine: Engine, io: FileIO, task: CleanupTask, delete_files: DeleteFiles) -> str:
    """Verify (protected tables) and purge one task; returns the task's final status."""
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
    summary = delete_files(parsed.metadata, task.metadata_location)
    st.finish_task(engine, task.id, DONE, summary)
    return DONE


def run_pending_tasks(engine: Engine, io: FileIO, warehouse: str, delete_files: DeleteFiles) -> dict[int, str]:
    """Every pending task of one warehouse (the operator's ``run-cleanup``); failed tasks are never retried."""
    return {task.id: run_cleanup_task(engine, io, task, delete_files) for task in st.pending_tasks(engine, warehouse)}
