"""Which credential sets a distributed scan's tickets carry, and what a reload yields for pushing.

``[coordinator] distributed_credentials`` decides: ``vended`` (only catalog-vended sets; a table without them
fails), ``static`` (the ``[storage]`` pair) or ``auto`` (vended when present, else static). Sets come from
``sqe.credentials`` already parsed (the table's ``ScopedFileIO``, or the credentials endpoint); here they are
only filtered by the one completeness rule and given SQE's own storage settings, as on the local path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqe.credentials import (
    VENDED_PARTS,
    CatalogCredentials,
    CredentialSet,
    StoragePolicy,
    StorageSettings,
    covered_by_any,
    is_object_store,
    prefix_matches,
    usable_until,
)
from sqe.credentials.paths import prefix_length
from sqe.credentials.policy import STATIC_PREFIX as EVERY_S3_PATH
from sqe.distributed.coordinator.failures import secret_values
from sqe.distributed.coordinator.refresh import IncompleteSet, RefreshedSets, TableLease
from sqe.distributed.protocol.ticket import WireTableId
from sqe.errors import CredentialError, NoVendedCredentialsError

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask

    from sqe.catalog.base import TableIdent
    from sqe.distributed.coordinator.fragments import Fragment


def ticket_sets(
    found: Iterable[CredentialSet], location: str, policy: StoragePolicy, received_at: float, source: str
) -> RefreshedSets:
    """The complete vended sets among ``found``, ready for tickets and pushes.

    A set equal to SQE's static pair is never treated as vended. An incomplete set (``missing_parts``) is
    dropped and recorded with what it lacks: an unknown expiry is never replaced by a made-up one.
    SQE's own storage settings win over the catalog's. As on the local path (``build_properties``), the
    config-level set is the fallback for every S3 path no ``storage-credentials`` entry covers, inside the table
    ``location`` or not, so it travels as the ``s3://`` set: scoped to the location, a file outside it (a
    migrated table's, a delete file written elsewhere) got the ``[storage]`` pair on a worker where the local path
    used the catalog's keys. Only an entry for ``s3://`` itself shadows it everywhere; then it is dropped.
    """
    vended = [c for c in found if c.source == "vended" and not policy.is_static_pair(c)]
    shadowed = covered_by_any(EVERY_S3_PATH, (c.prefix for c in vended if c.prefix is not None))
    complete: list[CredentialSet] = []
    dropped: list[IncompleteSet] = []
    for candidate in vended:
        if candidate.prefix is None and shadowed:
            continue
        scoped = candidate if candidate.prefix is not None else candidate.with_prefix(EVERY_S3_PATH)
        missing = candidate.missing_parts()
        if missing:
            dropped.append(IncompleteSet(scoped.prefix or location, tuple(missing)))
            continue
        complete.append(scoped.with_settings(policy.local_settings(candidate.settings)))
    limits = [usable_until(c.expires_at_ms, received_at, max_age_seconds=policy.max_age_seconds) for c in complete]
    until = min((limit for limit in limits if limit is not None), default=None)
    return RefreshedSets(tuple(complete), until, source, tuple(dropped))


def under_settings(found: CatalogCredentials, loaded: StorageSettings) -> CatalogCredentials:
    """A credentials-endpoint answer with the load-table answer's settings under its own, as the local path's
    refresh keeps them (``ScopedFileIO``): such an answer often holds keys only, and its sets would otherwise go to
    SQE's endpoint (AWS when none is set) rather than the store the catalog named."""
    sets = tuple(s.with_settings(loaded.overlay(s.settings)) for s in found.sets)
    return CatalogCredentials(loaded.overlay(found.settings), sets)


def static_set(policy: StoragePolicy) -> CredentialSet | None:
    """The ``[storage]`` pair as a set covering every S3 path (static mode only), or None."""
    return policy.static


def wire_table_id(ident: TableIdent) -> WireTableId:
    return WireTableId(ident.warehouse, tuple(ident.namespace), ident.name)


@dataclass
class TableCredentials:
    """What the tickets of one table scan may carry: vended sets (the lease's, when refreshed) and the static set.

    A ticket gets the static set only when one of its files has no vended set covering it (``static`` mode:
    always; ``auto``: files the catalog vended nothing for; ``vended``: never, there is no static set).
    """

    ident: TableIdent
    lease: TableLease | None  # None: nothing to refresh (no vended sets, or pushing disabled)
    vended: tuple[CredentialSet, ...] = field(repr=False)  # the vended sets when there is no lease
    static: CredentialSet | None = field(repr=False)

    def secret_values(self) -> frozenset[str]:
        """Every key id, secret and token a ticket or push of this table may have carried (to scrub, never to log):
        with a lease, those of its recent generations too, as a running fragment's ticket or an earlier push may
        hold keys a refresh has replaced since."""
        held = self.lease.held_secrets() if self.lease is not None else frozenset()
        static = (self.static,) if self.static is not None else ()
        return secret_values((*self.vended, *static)) | held

    def for_fragment(self, fragment: Fragment, vended: Sequence[CredentialSet]) -> list[CredentialSet]:
        return self.for_tasks(fragment.tasks, vended)

    def for_tasks(self, tasks: Sequence[FileScanTask], vended: Sequence[CredentialSet]) -> list[CredentialSet]:
        uncovered = [path for task in tasks for path in _uncovered_paths(task, vended)]
        self._refuse_dropped(uncovered)
        needs_static = self.static is not None and bool(uncovered)
        return [*vended, *([self.static] if needs_static and self.static is not None else [])]

    def _refuse_dropped(self, uncovered: Sequence[str]) -> None:
        """A file only a set a refresh dropped covered (Polaris's credentials endpoint leaves out load-table's
        ``config`` keys, which served files outside the table location) is never read with other keys."""
        dropped = self.lease.dropped_prefixes if self.lease is not None else ()
        path = next((p for p in uncovered if covered_by_any(p, dropped)), None)
        if path is not None:
            raise CredentialError(
                f"{self.ident}: the credential refresh returned no credentials for {path}, which the table's "
                "earlier credentials covered"
            )


def _uncovered_paths(task: FileScanTask, vended: Sequence[CredentialSet]) -> list[str]:
    """The object-store files of ``task`` (its data file, then its delete files: a worker opens each) that no
    vended set covers."""
    prefixes = [c.prefix or "" for c in vended]
    paths = [task.file.file_path, *sorted(d.file_path for d in task.delete_files)]
    return [p for p in paths if is_object_store(p) and not covered_by_any(p, prefixes)]


def _uncovered_path(task: FileScanTask, vended: Sequence[CredentialSet]) -> str | None:
    """The first of :func:`_uncovered_paths`, or None."""
    return next(iter(_uncovered_paths(task, vended)), None)


def check_coverage(
    ident: TableIdent,
    tasks: Sequence[FileScanTask],
    vended: RefreshedSets,
    fallback: CredentialSet | None,
    mode: str,
    require_vended: bool,
) -> None:
    """Fail early and clearly when a file would reach a worker with no set covering it."""
    if fallback is not None:
        return
    for task in tasks:
        path = _uncovered_path(task, vended.credentials)
        if path is None:
            continue
        if mode == "vended":
            raise NoVendedCredentialsError(
                f'{ident}: coordinator.distributed_credentials is "vended" but {_vended_gap(path, vended.dropped)}'
            )
        why = (
            "catalog.require_vended_credentials forbids the [storage] pair"
            if require_vended
            else "[storage] has no key pair"
        )
        raise CredentialError(
            f"{ident}: no credentials a worker may use for {path}: the catalog vended none and "
            f"{why} (workers never fall back to ambient credentials)"
        )


def _vended_gap(path: str, dropped: Sequence[IncompleteSet]) -> str:
    """Why no vended set covers ``path``, in the completeness rule's own words (the parts it names)."""
    covering = [s for s in dropped if prefix_matches(path, s.prefix)]
    if covering:
        nearest = max(covering, key=lambda s: prefix_length(s.prefix))  # the one that would have been used
        return f"the credential set the catalog vended for {path} is incomplete (missing {', '.join(nearest.missing)})"
    return f"the catalog vended no complete credential set ({', '.join(VENDED_PARTS)}) covering {path}"
