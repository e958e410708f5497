"""What the scan benchmarks share: the synthetic table they write and the moto stack they run it on.

Imported by the scripts beside it (``python bench/<script>.py`` puts this folder first on ``sys.path``).
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyiceberg.catalog.rest import RestCatalog

from sqe.catalog.base import TableIdent, ViewDefinition
from sqe.errors import NoSuchTableError, NoSuchViewError
from sqe.session import Session
from sqe.vocabulary import S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN


class ReadOnlyProvider:
    """The parts of SQE's ``TableProvider`` a benchmark over a local catalog never uses: every change, and
    listing, is refused with the engine's typed error. Subclasses give ``default_warehouse`` and ``load_table``."""

    def create_table(self, ident: TableIdent, schema: pa.Schema) -> Any:
        raise NoSuchTableError("the benchmark provider is read-only")

    def drop_table(self, ident: TableIdent) -> None:
        raise NoSuchTableError("the benchmark provider is read-only")

    def list_tables(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        raise NoSuchTableError("the benchmark provider lists nothing")

    def list_namespaces(self, warehouse: str, parent: tuple[str, ...] | None = None) -> list[tuple[str, ...]]:
        raise NoSuchTableError("the benchmark provider lists nothing")

    def create_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        raise NoSuchTableError("the benchmark provider is read-only")

    def drop_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        raise NoSuchTableError("the benchmark provider is read-only")

    def invalidate(self, ident: TableIdent) -> None:
        """Nothing is cached here: every load reads the local catalog."""

    def load_view(self, ident: TableIdent) -> ViewDefinition:
        raise NoSuchViewError(f"view {ident} does not exist")

    def create_view(
        self, ident: TableIdent, schema: pa.Schema, sql: str, dialect: str, *, replace: bool = False
    ) -> None:
        raise NoSuchTableError("the benchmark provider is read-only")

    def drop_view(self, ident: TableIdent) -> None:
        raise NoSuchViewError(f"view {ident} does not exist")

    def list_views(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        return []

    def scan_planning(self, warehouse: str) -> None:
        return None  # planned locally

    def load_table_credentials(self, ident: TableIdent) -> None:
        return None  # a local catalog vends nothing


TAGS = pa.array([f"tag-{i:03d}" for i in range(100)])


def chunk(start: int, rows: int) -> pa.Table:
    """Rows ``start .. start+rows-1``: id, x (0..999 random), y (random double), tag (100 distinct strings)."""
    x = pc.cast(pc.floor(pc.multiply(pc.random(rows), 1000)), pa.int64())
    tag_index = pc.cast(pc.floor(pc.multiply(pc.random(rows), len(TAGS))), pa.int32())
    return pa.table(
        {
            "id": pa.array(range(start, start + rows), pa.int64()),
            "x": x,
            "y": pc.random(rows),
            "tag": TAGS.take(tag_index),
        }
    )


@contextmanager
def store_stack(root: Path, store: str = "moto") -> Iterator[Any]:
    """The embedded stack under ``root/stack``, stopped on exit: on moto, or with ``store="ceph"`` on Ceph RGW
    (a real object store, whose ranged GETs cost by the range, where moto's read the whole object). Its
    ``sqe serve`` is not started: these benchmarks query through sessions of their own."""
    from sqe_stack import apply_client_env, start_stack, stop_stack

    apply_client_env(store)  # before this process's first pyarrow S3 filesystem (the writer's)
    started = time.perf_counter()
    info = start_stack(root / "stack", store=store, serve=False)
    print(f"{store}: stack up in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        yield info
    finally:
        stop_stack(root / "stack")


def vended_filesystem(session: Session, path: str, endpoint: str, region: str) -> pafs.S3FileSystem:
    """An S3 filesystem holding the very keys SQE's FileIO resolved for ``path``."""
    [stream] = session.last_streams
    properties = stream.plan.loaded.io.resolve(path).properties  # type: ignore[attr-defined]
    parts = urlsplit(endpoint)
    return pafs.S3FileSystem(
        access_key=properties[S3_ACCESS_KEY_ID],
        secret_key=properties[S3_SECRET_ACCESS_KEY],
        session_token=properties.get(S3_SESSION_TOKEN),
        endpoint_override=parts.netloc,
        scheme=parts.scheme,
        region=region,
        force_virtual_addressing=False,
    )


def principal_settings(config_path: Path) -> dict[str, Any]:
    with config_path.open("rb") as fh:
        return dict(tomllib.load(fh)["catalog"])


def rest_catalog(settings: dict[str, Any]) -> RestCatalog:
    return RestCatalog(
        "bench",
        uri=settings["uri"],
        warehouse=settings["warehouse"],
        credential=f"{settings['client_id']}:{settings['client_secret']}",
        scope=settings["scope"],
        **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )


def principal_catalog(config_path: Path) -> RestCatalog:
    """``rest_catalog`` as the principal of an SQE config file."""
    return rest_catalog(principal_settings(config_path))
