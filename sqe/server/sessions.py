"""Client sessions of ``sqe serve``: per (user, client session) engine sessions, open queries and limits.

A client session belongs to exactly one authenticated user under one authority (its key includes the user and
what their token authorizes: another token of the same principal with other roles gets a session of its own),
so nothing in it — engine sessions with their DuckDB connections, metadata caches and credential leases,
prepared statements, open results — is reachable by anyone else, or under other roles, even with its session
id. Each open query runs on an engine
``Session`` of its own from the client session's small pool (a DuckDB connection runs one statement at a time),
so concurrent statements of one client never invalidate each other. Engine sessions are built by
:func:`_user_config` over the user's catalog token (delegated or their own) and replaced when that token changes.

:class:`Limits` counts running queries per user and in total; :class:`Watchdog` cancels queries past their
timeout or whose client went away, drops results nobody fetched (their DoGet never came within
``unfetched_result_seconds``, or their client's connection closed), and expires idle client sessions.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import SecretStr

from sqe._machine import memory_share, spill_share
from sqe._text import counted, short_identity
from sqe._unpicklable import Unpicklable
from sqe.catalog.rest import RestTableProvider
from sqe.config import ExternalTablesConfig, SiblingWarehouseConfig, SQEConfig, same_catalog
from sqe.duckdb_connection import DatabaseLimits, spill_disk_free_bytes
from sqe.errors import QueryError, SQEError
from sqe.server.identity import IdentityBroker, User, fingerprint, identity_digest
from sqe.server.mount_stores import MARK_INTERVAL_SECONDS, StoreHold, claim_store, store_path
from sqe.server.peers import Endpoint, connected_peers, parse_peer
from sqe.session import PreparedStatement, Session

if TYPE_CHECKING:
    import pyarrow.flight as flight

    from sqe.server.config import ServerConfig

log = logging.getLogger(__name__)

PEER_KEY_PREFIX = "peer:"  # a client session keyed by its connection (the client sends no session cookie)
MAX_OFFERED_COOKIES = 4  # session cookies a client session keeps valid: the ones offered last
MAX_PREPARED_STATEMENTS = 1024  # open prepared statements per client session (each holds plans and credentials)
# computed metadata results (catalogs, namespaces, tables, SQL info) a client session holds until their DoGet: they
# take no query slot, so without a bound a client that never fetches would pile them up for unfetched_result_seconds
MAX_WAITING_RESULTS = 64
# client sessions per user (each session id they send makes one, and each keeps an idle engine: a DuckDB database
# with its threads); past it their least recently used idle session is closed
MAX_CLIENT_SESSIONS_PER_USER = 64


@dataclass(frozen=True, slots=True, repr=False)
class SessionKey(Unpicklable):
    """What a client session is found by: limits and budgets count per ``user``, state never crosses ``authority``.

    Its repr names the user and a short tag only: the authority digest (of an opaque token, the token's SHA-256)
    and the client's session id stay out of logs and reprs, and out of pickles, which it refuses.
    """

    user: str  # the principal (``User.key``)
    authority: str  # what the caller's token authorizes (``User.authority``): its roles, scope, actor
    tag: str  # the client's session id, or ``peer:<address>`` for a client without cookies

    _pickle_refusal = "session keys carry the authority digest and session id, and cannot be pickled"

    def __repr__(self) -> str:
        return f"SessionKey(user={short_identity(self.user)!r}, tag={self.short_tag!r})"

    @property
    def short_tag(self) -> str:
        """The peer address of a connection-keyed session, else a fingerprint of its session id."""
        return self.tag if self.tag.startswith(PEER_KEY_PREFIX) else f"session:{fingerprint(self.tag)[:8]}"


class ServerBusyError(SQEError):
    """A concurrency limit is full; the client may retry later."""


class QueryTimeoutError(SQEError):
    """The query ran longer than ``query_timeout_seconds``."""


class UnknownHandleError(QueryError):
    """A ticket or prepared-statement handle this client session does not hold."""


def _served_siblings(base: SQEConfig) -> list[SiblingWarehouseConfig]:
    """The sibling warehouses served to users: those on the primary catalog. A user's token is the primary
    catalog's: a sibling on another catalog would receive it (and could replay it at the primary as this user), so
    such a sibling is not served to a user at all."""
    primary = base.catalog.uri
    return [w for w in base.catalog.warehouses if not w.uri or same_catalog(w.uri, primary)]


def served_warehouses(base: SQEConfig) -> tuple[str, ...]:
    """The warehouses a user's session can query (the primary, then its siblings on the same catalog): all that
    the metadata listings may show or list at the catalog."""
    return (base.catalog.warehouse, *(w.name for w in _served_siblings(base)))


def _user_config(base: SQEConfig, token: str, owner: SessionKey) -> SQEConfig:
    """The server's engine config as ``token``'s holder: that catalog token only, no other credential.

    The one place that builds a user's config. Sibling warehouses of the same catalog lose their own credentials
    too, so every catalog call of the session carries this user's token; siblings on another catalog are left out.
    """
    no_auth: dict[str, object] = {
        "client_id": None,
        "client_secret": None,
        "token": None,
        "reader_client_id": None,
        "reader_client_secret": None,
    }
    siblings = tuple(w.model_copy(update=no_auth) for w in _served_siblings(base))
    # The token is already the user's own or a delegated one (IdentityBroker): the engine must not exchange again.
    catalog = base.catalog.model_copy(update={**no_auth, "token": SecretStr(token), "warehouses": siblings})
    return base.model_copy(update={"catalog": catalog, "external_tables": _user_external_tables(base, owner)})


def _user_external_tables(base: SQEConfig, owner: SessionKey) -> ExternalTablesConfig:
    """A store of external tables per user and authority, each mount with keys of its own: never the server's
    environment or [storage].

    Keyed like client sessions, by the authority too: one user's mounts are never listed, read, dropped or able to
    shadow a table for another, nor for a token of the same user with other roles (a narrower token would read
    with keys sealed under a wider one, and its mount would replace a same-named table for the wider one).
    """
    section = base.external_tables
    path = str(store_path(section.path, owner.user, owner.authority)) if section.path else section.path
    return section.model_copy(update={"path": path, "environment_keys": False, "storage_keys": False})


# ---------------------------------------------------------------------------------------------- limits


class Limits:
    """Running-query counters: at most ``total`` queries, at most ``per_user`` for one user. ``what`` names the
    calls counted in a refusal, one and many (queries, or planning calls, which have counters of their own)."""

    def __init__(self, total: int, per_user: int, what: tuple[str, str] = ("query", "queries")) -> None:
        self.total = total
        self.per_user = per_user
        self.what = what
        self._lock = threading.Lock()
        self._running = 0
        self._by_user: dict[str, int] = {}

    def acquire(self, user_key: str) -> None:
        with self._lock:
            mine = self._by_user.get(user_key, 0)
            if mine >= self.per_user:
                raise ServerBusyError(
                    f"server busy: {counted(mine, *self.what)} of this user {_are(mine)} running "
                    f"(max_concurrent_queries_per_user = {self.per_user}); retry when one finishes"
                )
            if self._running >= self.total:
                raise ServerBusyError(
                    f"server busy: {counted(self._running, *self.what)} {_are(self._running)} running "
                    f"(max_concurrent_queries = {self.total}); retry later"
                )
            self._running += 1
            self._by_user[user_key] = mine + 1

    def release(self, user_key: str) -> None:
        with self._lock:
            self._running -= 1
            left = self._by_user.get(user_key, 1) - 1
            if left > 0:
                self._by_user[user_key] = left
            else:
                self._by_user.pop(user_key, None)

    def running(self) -> int:
        with self._lock:
            return self._running


def _are(count: int) -> str:
    return "is" if count == 1 else "are"


# ----------------------------------------------------------------------------------------- engine pool

DEFAULT_ENGINE_THREADS = 4


def engine_limits(server: ServerConfig) -> DatabaseLimits:
    """Each engine's DuckDB limits: the ``[server]`` ones set, else its share of the machine. Every running query
    has an engine of its own, so ``max_concurrent_queries`` engines at their limits together take at most half the
    memory, or of a container's limit when less (DuckDB's buffers; Arrow scans and SQE's caches come on top), and
    half the spill disk's free space at start; a user (``max_concurrent_queries_per_user``) a part of that."""
    queries = server.max_concurrent_queries
    memory = server.engine_memory_bytes
    if memory is None:
        memory = memory_share(queries)
    threads = server.engine_threads or min(DEFAULT_ENGINE_THREADS, os.cpu_count() or 1)
    spill = server.engine_spill_bytes
    if spill is None:
        spill = spill_share(spill_disk_free_bytes(), queries)
    return DatabaseLimits(memory_bytes=memory, threads=threads, spill_bytes=spill)


_ENGINE_SERIALS = itertools.count(1)


@dataclass
class Engine:
    """One engine session of a client session, built over one catalog token."""

    session: Session
    provider: RestTableProvider
    token_key: str = field(repr=False)  # digest of the catalog token it was built with (whole: never shared)
    busy: bool = False
    serial: int = field(default_factory=lambda: next(_ENGINE_SERIALS))
    last_used: float = field(default_factory=time.monotonic)
    acquired_at: int = 0  # the client session's release count when this engine was last acquired

    def close(self) -> None:
        """Close the engine session and its catalog connections (else each leaves sockets in CLOSE_WAIT)."""
        for part in (self.session, self.provider):
            try:
                part.close()
            except Exception as exc:  # closing must not fail a request; the connection is gone either way
                log.debug("closing an engine session failed: %s", type(exc).__name__)


@dataclass
class Prepared:
    """A Flight SQL prepared statement: its SQL, the parameters bound last, and its plans per engine."""

    sql: str = field(repr=False)  # may hold keys (CREATE EXTERNAL TABLE ... WITH)
    parameters: pa.Table | None = None
    plans: dict[int, PreparedStatement] = field(default_factory=dict)  # engine serial -> its plan


# Who owns an OpenQuery: its GetFlightInfo while it plans, nobody while it waits for its DoGet, then that DoGet.
_PLANNING, _WAITING, _STREAMING = "planning", "waiting", "streaming"


@dataclass
class OpenQuery:
    """A result between GetFlightInfo and the end of its DoGet (or a metadata table waiting for DoGet).

    Only its owner (the planning GetFlightInfo, then the streaming DoGet) reads its stream or finishes it while it
    is owned; other threads (watchdog, CancelFlightInfo, session close) only ``cancel`` it, or finish it while it
    waits. A Flight call context is only valid during its call, so the watchdog sees one only while the owner is
    inside that call (:meth:`serving`), never after.
    """

    handle: bytes
    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    deadline: float
    cancel_engine: Callable[[], None]
    release: Callable[[], None]
    close_stream: Callable[[], None] = lambda: None  # frees the engine's result before the engine is reused
    fetch_seconds: float = math.inf  # how long a planned result waits for its DoGet
    waiting_since: float = math.inf  # when it started to wait for its DoGet
    failed: bool = False  # its statement or stream raised
    cancelled: str | None = None  # why it was cancelled: "timeout", "client", "cancel"
    state: str = _WAITING
    _live_call: flight.ServerCallContext | None = None
    _done: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_planning(cls, **fields: Any) -> OpenQuery:
        """A query its GetFlightInfo (or DoPut) still runs: nobody else may finish it."""
        return cls(state=_PLANNING, **fields)

    def cancel(self, reason: str) -> bool:
        """Stop the query (idempotent); False when it had already finished.

        Interrupts under the lock: ``finish`` (which may close the engine) cannot run meanwhile, so an interrupt
        never meets a connection being closed.
        """
        with self._lock:
            if self._done:
                return False
            if self.cancelled is None:
                self.cancelled = reason
            self.cancel_engine()
        return True

    def planned(self) -> None:
        """Its GetFlightInfo is done: it waits for a DoGet (or the watchdog and CancelFlightInfo may free it)."""
        with self._lock:
            if self.state == _PLANNING:
                self.state = _WAITING
                self._start_waiting()

    def _start_waiting(self) -> None:
        self.waiting_since = time.monotonic()

    def __post_init__(self) -> None:
        if self.state == _WAITING:  # built already computed (a metadata table): it waits from now on
            self._start_waiting()

    def unfetched(self, now: float, connection_gone_at: float | None) -> bool:
        """Still waiting for a DoGet that will not come: ``fetch_seconds`` past, or its connection closed since."""
        with self._lock:
            if self._done or self.state != _WAITING:
                return False
            closed = connection_gone_at is not None and self.waiting_since < connection_gone_at
            return now >= self.waiting_since + self.fetch_seconds or closed

    def claim(self) -> bool:
        """The DoGet that streams it takes ownership; False when it is finished or another call owns it."""
        with self._lock:
            if self._done or self.state != _WAITING:
                return False
            self.state = _STREAMING
            return True

    def finish_if_waiting(self) -> bool:
        """Finish it when no call owns it (never fetched); False when a call owns it (that call finishes it)."""
        with self._lock:
            if self._done or self.state != _WAITING:
                return False
            self.state = _STREAMING  # a DoGet arriving now finds it taken
        self.finish()
        return True

    @contextmanager
    def serving(self, context: flight.ServerCallContext | None) -> Iterator[None]:
        """While the owner runs inside ``context``'s call: the watchdog may ask whether that client went away."""
        with self._lock:
            self._live_call = context
        try:
            yield
        finally:
            with self._lock:
                self._live_call = None

    def client_gone(self) -> bool:
        """Whether the client of the call now working on it cancelled; the lock keeps that call alive meanwhile."""
        with self._lock:
            return self._live_call is not None and _client_gone(self._live_call)

    def finish(self) -> None:
        """Free its result, then its engine and slot (once). Called by its owner, or by whoever claimed it."""
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            self.close_stream()
        except Exception as exc:  # a broken stream must still give its engine and slot back
            log.debug("closing a result stream failed: %s", type(exc).__name__)
        # drop the DuckDB stream here, on the owner's thread, before the engine can run another statement
        self.batches, self.close_stream = iter(()), _nothing
        self.release()

    @property
    def done(self) -> bool:
        return self._done


def _nothing() -> None:
    return None


class ClientSession:
    """Everything one (user, client session) owns. Engines are created on demand over the current token."""

    def __init__(
        self, key: SessionKey, base: SQEConfig, batch_rows: int, database_limits: DatabaseLimits | None = None
    ) -> None:
        self.key = key
        self._base = base
        self._database_limits = database_limits
        self._batch_rows = batch_rows
        self._lock = threading.Lock()
        self._engines: list[Engine] = []
        self._releases = 0  # engines released so far: another engine ran (and may have written) in between
        self.prepared: dict[bytes, Prepared] = {}
        self._bound_bytes = 0  # of the parameter rows bound to ``prepared`` (bind_parameters, close_prepared)
        self.open: dict[bytes, OpenQuery] = {}
        self.last_used = time.monotonic()
        self.calls = 0  # calls running on it (``SessionRegistry.enter`` / ``leave``, under the registry's lock)
        self._closed = False
        self._store_lock = threading.Lock()
        self._store_hold: StoreHold | None = None  # its mount store, held while it may use it (prunes skip it)
        self._store_marked_at = -math.inf  # when its mount store was last marked as used

    @property
    def user_key(self) -> str:
        return self.key.user

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def acquire_engine(self, catalog_token: str) -> Engine:
        """An idle engine built over ``catalog_token`` (stale-token idle engines are closed), marked busy."""
        self._claim_mount_store()
        wanted = identity_digest(catalog_token)
        stale: list[Engine] = []
        with self._lock:
            for engine in list(self._engines):
                if engine.busy:
                    continue
                if engine.token_key != wanted:
                    self._engines.remove(engine)
                    stale.append(engine)
                    continue
                engine.busy = True
                chosen: Engine | None = engine
                break
            else:
                chosen = None
            # released once since (itself): any more releases were other engines', which may have written
            others_ran = chosen is not None and self._releases > chosen.acquired_at + 1
            if chosen is not None:
                chosen.acquired_at = self._releases
        self._close_engines(stale)
        if chosen is not None:
            if others_ran:  # their writes invalidated their own load caches only: a session reads its writes
                chosen.provider.forget_cached_tables()
            return chosen
        config = _user_config(self._base, catalog_token, self.key)
        provider = RestTableProvider(config)
        session = Session(
            provider,
            config,
            view_warehouses=self._base.catalog.warehouse_names,
            database_limits=self._database_limits,
        )
        engine = Engine(session, provider, wanted, busy=True, acquired_at=self._releases)
        with self._lock:
            self._engines.append(engine)
        return engine

    def _claim_mount_store(self) -> None:
        """Before each engine: hold the user's mount store (moved from its earlier name first) while this session
        lives, so a prune never deletes it under the session; mark it as used at most hourly. A user without a
        store yet is claimed again on the next call (the store their CREATE EXTERNAL TABLE made is held then)."""
        base = self._base.external_tables.path
        if not base or self._closed:
            return
        now = time.monotonic()
        with self._store_lock:
            if self._store_hold is None:
                # raises (the call fails) rather than lose the mounts
                self._store_hold = claim_store(base, self.key.user, self.key.authority)
                self._store_marked_at = now
            elif now - self._store_marked_at >= MARK_INTERVAL_SECONDS:
                self._store_hold.mark_used()
                self._store_marked_at = now

    def _let_go_of_store_when_done(self) -> None:
        """Once closed and its last engine is closed, let go of the mount store (not before: a busy engine still
        reads or writes it, and SQLite's locks must not lose the file under it)."""
        with self._lock:
            done = self._closed and not self._engines
        if not done:
            return
        with self._store_lock:
            hold, self._store_hold = self._store_hold, None
        if hold is not None:
            hold.release()

    def release_engine(self, engine: Engine, *, discard: bool = False) -> None:
        """Back to the pool; ``discard`` (after a cancelled or failed query) closes it instead.

        Also closes it when the client session closed meanwhile: a busy engine is only ever closed by its holder.
        """
        with self._lock:
            self._releases += 1
            discard = discard or self._closed
            if discard:
                if engine in self._engines:
                    self._engines.remove(engine)
                extra = [engine]
            else:
                engine.busy = False
                engine.last_used = time.monotonic()
                # keep one idle engine (its caches) and the busy ones; more idle ones are closed
                idle = [e for e in self._engines if not e.busy]
                extra = idle[:-1] if len(idle) > 1 else []
                for e in extra:
                    self._engines.remove(e)
        self._close_engines(extra)
        self._let_go_of_store_when_done()

    def _close_engines(self, engines: list[Engine]) -> None:
        """Close them and drop their plans from every prepared statement: a plan holds its engine's session,
        tables and vended credentials, and a failed query discards its engine (one more plan each time)."""
        serials = {engine.serial for engine in engines}
        for prepared in list(self.prepared.values()):
            for serial in serials:
                prepared.plans.pop(serial, None)
        for engine in engines:
            engine.close()

    def hold_result(self, query: OpenQuery) -> None:
        """Keep a computed result for its DoGet; refused (``server busy``) past ``MAX_WAITING_RESULTS`` unfetched."""
        with self._lock:
            waiting = sum(1 for held in self.open.values() if held.state == _WAITING and not held.done)
            if waiting >= MAX_WAITING_RESULTS:
                raise ServerBusyError(
                    f"server busy: this client session holds {waiting} results not fetched yet (at most "
                    f"{MAX_WAITING_RESULTS}); read them with DoGet, or wait for unfetched_result_seconds to drop them"
                )
            self.open[query.handle] = query

    def add_prepared(self, handle: bytes, prepared: Prepared) -> None:
        with self._lock:
            if len(self.prepared) >= MAX_PREPARED_STATEMENTS:
                raise QueryError(
                    f"this client session holds {MAX_PREPARED_STATEMENTS} open prepared statements: close some first"
                )
            self._bound_bytes += _parameter_bytes(prepared)
            self.prepared[handle] = prepared

    def bound_parameter_bytes(self, excluding: bytes | None = None) -> int:
        """Bytes of the parameter rows bound to this session's prepared statements, ``excluding``'s aside (a
        counter: ``ParameterBudget`` asks for every chunk a client sends)."""
        with self._lock:
            own = self.prepared.get(excluding) if excluding is not None else None
            return self._bound_bytes - (_parameter_bytes(own) if own is not None else 0)

    def bind_parameters(self, handle: bytes, prepared: Prepared, rows: pa.Table) -> None:
        """Bind ``rows`` to the statement ``handle`` still names. A statement closed while its DoPut received the
        rows (or whose session closed) is refused: bound to it, they would count as held for the session's life."""
        with self._lock:
            if self.prepared.get(handle) is not prepared:
                raise UnknownHandleError("the prepared statement was closed while its parameter rows arrived")
            self._bound_bytes += rows.nbytes - _parameter_bytes(prepared)
            prepared.parameters = rows

    def close_prepared(self, handle: bytes) -> None:
        with self._lock:
            gone = self.prepared.pop(handle, None)
            self._bound_bytes -= _parameter_bytes(gone) if gone is not None else 0

    def new_handle(self) -> bytes:
        return secrets.token_bytes(16)

    def is_idle_since(self, cutoff: float) -> bool:
        with self._lock:
            busy = any(e.busy for e in self._engines)
        return not busy and not self.open and not self.calls and self.last_used < cutoff

    def close(self) -> None:
        """Cancel its queries and close its idle engines; a query's owner finishes it and closes its engine.

        Closing an engine another thread still reads (a DoGet stream, a statement) would crash DuckDB, so busy
        engines are closed by ``release_engine`` when their holder is done.
        """
        with self._lock:
            self._closed = True
            idle = [e for e in self._engines if not e.busy]
            self._engines = [e for e in self._engines if e.busy]
        for query in list(self.open.values()):
            query.cancel("session closed")
            if query.finish_if_waiting() or query.done:
                self.open.pop(query.handle, None)
        self._close_engines(idle)
        with self._lock:
            self.prepared.clear()
            self._bound_bytes = 0
        self._let_go_of_store_when_done()


def _parameter_bytes(prepared: Prepared) -> int:
    return prepared.parameters.nbytes if prepared.parameters is not None else 0


# ------------------------------------------------------------------------------------------- registry


class ParameterBudget:
    """``[server] max_parameter_bytes`` per user: the parameter rows they hold in memory, bound to the prepared
    statements of any of their client sessions or being received right now.

    Parameter rows are read before a query slot is taken, so this is what bounds them. Received bytes are reserved
    chunk by chunk under one lock and stay reserved until they are bound (``bind``, under the same lock) or the
    call ends (``release``): concurrent calls never each count the other's bytes as free, and a user's sessions
    (one per session id they choose) share one limit.
    """

    def __init__(self, registry: SessionRegistry, limit: int) -> None:
        self._registry = registry
        self.limit = limit
        self._lock = threading.Lock()
        self._receiving: dict[str, int] = {}  # user key -> bytes reserved by calls still receiving or running

    def reserve(self, session: ClientSession, handle: bytes, size: int, *, replacing: bool) -> None:
        """Reserve ``size`` more bytes for a call on ``handle``; ``replacing``: the rows will replace those bound to
        it (a bind), so those are not counted; an update's rows are held beside them."""
        user = session.user_key
        with self._lock:
            held = self._bound(user, session, handle if replacing else None) + self._receiving.get(user, 0)
            if held + size > self.limit:
                also = f", counting {held} bytes you already hold" if held else ""
                raise QueryError(
                    f"the parameter rows sent exceed [server] max_parameter_bytes ({self.limit} bytes{also})"
                )
            self._receiving[user] = self._receiving.get(user, 0) + size

    def bind(self, session: ClientSession, handle: bytes, prepared: Prepared, rows: pa.Table, reserved: int) -> None:
        """Bind ``rows`` to ``prepared`` and turn their reservation into bound bytes in one step (released as
        well when the statement is gone)."""
        with self._lock:
            try:
                session.bind_parameters(handle, prepared, rows)
            finally:
                self._release(session.user_key, reserved)

    def release(self, session: ClientSession, reserved: int) -> None:
        with self._lock:
            self._release(session.user_key, reserved)

    def _release(self, user: str, reserved: int) -> None:
        left = self._receiving.get(user, 0) - reserved
        if left > 0:
            self._receiving[user] = left
        else:
            self._receiving.pop(user, None)

    def _bound(self, user: str, session: ClientSession, handle: bytes | None) -> int:
        return sum(
            other.bound_parameter_bytes(excluding=handle if other is session else None)
            for other in self._registry.sessions()
            if other.user_key == user
        )


class SessionRegistry:
    """Client sessions by :class:`SessionKey`; session-id aliases map a cookie to a peer-keyed session."""

    def __init__(
        self,
        base: SQEConfig,
        broker: IdentityBroker,
        limits: Limits,
        batch_rows: int,
        database_limits: DatabaseLimits | None = None,
    ) -> None:
        self.base = base
        self.broker = broker
        self.limits = limits
        self.batch_rows = batch_rows
        self.database_limits = database_limits  # of each engine (each user's DuckDB database); None: DuckDB's
        self._lock = threading.Lock()
        self._sessions: dict[SessionKey, ClientSession] = {}
        self._aliases: dict[SessionKey, SessionKey] = {}
        self._offered: dict[SessionKey, collections.deque[SessionKey]] = {}  # session key -> its aliases

    def resolve(self, user: User, session_id: str | None, peer: str, new_cookie: str | None) -> ClientSession:
        """The caller's client session: by its session id when it sent one, else by its connection (peer).

        ``new_cookie`` is the id this response offers the client; it becomes an alias of the same session so a
        client that starts sending it keeps its prepared statements and results.
        """
        return self._resolve(user, session_id, peer, new_cookie, entering=False)

    def enter(self, user: User, session_id: str | None, peer: str, new_cookie: str | None) -> ClientSession:
        """``resolve`` for a call, which holds the session until ``leave``: a running call's session (a DoPut still
        receiving rows, a token exchange before its engine) is never idle, so never closed under it."""
        return self._resolve(user, session_id, peer, new_cookie, entering=True)

    def leave(self, session: ClientSession) -> None:
        with self._lock:
            session.calls -= 1

    def _resolve(
        self, user: User, session_id: str | None, peer: str, new_cookie: str | None, *, entering: bool
    ) -> ClientSession:
        with self._lock:
            if session_id is not None:
                named = SessionKey(user.key, user.authority, session_id)
                key = self._aliases.get(named, named)
            else:
                key = SessionKey(user.key, user.authority, f"{PEER_KEY_PREFIX}{peer}")
            session = self._sessions.get(key)
            evicted = None
            if session is None:
                evicted = self._make_room(user.key)
                session = self._sessions[key] = ClientSession(key, self.base, self.batch_rows, self.database_limits)
            if new_cookie is not None:
                self._offer(key, SessionKey(user.key, user.authority, new_cookie))
            session.touch()
            if entering:
                session.calls += 1
        if evicted is not None:
            evicted.close()
        return session

    def _make_room(self, user_key: str) -> ClientSession | None:
        """At the per-user bound, drop (for the caller to close) the user's least recently used idle session;
        refuse when none is idle. Under the lock."""
        mine = [s for s in self._sessions.values() if s.user_key == user_key]
        if len(mine) < MAX_CLIENT_SESSIONS_PER_USER:
            return None
        # idle for a moment at least: a client's next call on it usually follows its last one closely
        idle = [s for s in mine if s.is_idle_since(time.monotonic() - 1.0)]
        if not idle:
            raise ServerBusyError(
                f"server busy: this user holds {len(mine)} client sessions, all working; retry when one finishes"
            )
        oldest = min(idle, key=lambda s: s.last_used)
        self._forget(oldest)
        return oldest

    def _forget(self, session: ClientSession) -> None:
        """Drop ``session`` and its cookie aliases from the registry (under the lock; the caller closes it)."""
        del self._sessions[session.key]
        for alias in self._offered.pop(session.key, ()):
            self._aliases.pop(alias, None)

    def _offer(self, key: SessionKey, alias: SessionKey) -> None:
        """Map the cookie offered now to ``key``; a client without cookies gets one per call, so only the last
        few offered stay valid (the one it may start sending), not one more per call for the session's life."""
        offered = self._offered.setdefault(key, collections.deque())
        offered.append(alias)
        self._aliases[alias] = key
        while len(offered) > MAX_OFFERED_COOKIES:
            self._aliases.pop(offered.popleft(), None)

    def sessions(self) -> list[ClientSession]:
        with self._lock:
            return list(self._sessions.values())

    def expire_idle(self, idle_seconds: float) -> int:
        cutoff = time.monotonic() - idle_seconds
        return self._close_where(lambda session: session.is_idle_since(cutoff))

    def close_disconnected(self, connected: set[Endpoint], seen_at: float) -> int:
        """Close the idle connection-keyed sessions whose client connection is no longer ``connected``.

        ``connected`` was read at ``seen_at`` (monotonic): a session used since then may belong to a connection
        opened after that snapshot, so it is kept until the next one.

        Only sessions keyed by their peer (clients without cookies) are tied to a connection; a session with
        a busy engine or an open result is left to its query (the watchdog cancels those whose client went).
        """
        return self._close_where(lambda session: _peer_gone(session, connected, seen_at))

    def _close_where(self, doomed: Callable[[ClientSession], bool]) -> int:
        """Drop the sessions ``doomed`` picks (and their cookie aliases), then close them outside the lock."""
        with self._lock:
            gone = [s for s in self._sessions.values() if doomed(s)]
            for session in gone:
                self._forget(session)
        for session in gone:
            session.close()
        return len(gone)

    def close(self) -> None:
        self._close_where(lambda _session: True)


def _peer_gone(session: ClientSession, connected: set[Endpoint], seen_at: float) -> bool:
    return _connection_closed(session, connected) and session.is_idle_since(seen_at)


class Watchdog:
    """A background thread: cancels timed-out queries and those whose client went away; expires sessions.

    Every ``peer_interval`` seconds it also closes the sessions of clients whose connection closed, so their
    engines' threads and descriptors are freed at once rather than after ``idle_seconds``.
    """

    def __init__(
        self, registry: SessionRegistry, idle_seconds: float, interval: float = 0.2, peer_interval: float = 1.0
    ) -> None:
        self._registry = registry
        self._idle_seconds = idle_seconds
        self._interval = interval
        self._peer_interval = peer_interval
        self._peers_checked = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqe-server-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sweep()
            except Exception as exc:  # the watchdog must outlive any one odd session
                log.error("watchdog sweep failed: %s", type(exc).__name__)

    def sweep(self) -> None:
        now = time.monotonic()
        connected: set[Endpoint] | None = None
        seen_at = now
        if now - self._peers_checked >= self._peer_interval:
            self._peers_checked = seen_at = time.monotonic()
            connected = connected_peers()
        for session in self._registry.sessions():
            gone_at = seen_at if connected is not None and _connection_closed(session, connected) else None
            for query in list(session.open.values()):
                if query.done:
                    session.open.pop(query.handle, None)
                elif now >= query.deadline:
                    query.cancel("timeout")
                    if query.finish_if_waiting():  # never fetched: free it now (an owner finishes its own)
                        session.open.pop(query.handle, None)
                elif query.unfetched(now, gone_at):
                    _drop_unfetched(session, query)
                elif query.client_gone():
                    query.cancel("client")
        self._registry.expire_idle(self._idle_seconds)
        if connected is not None:
            closed = self._registry.close_disconnected(connected, seen_at)
            if closed:
                log.debug("closed %d client session(s) whose connection closed", closed)


def _connection_closed(session: ClientSession, connected: set[Endpoint]) -> bool:
    """Whether ``session`` is keyed by a client connection that is no longer open."""
    tag = session.key.tag
    if not tag.startswith(PEER_KEY_PREFIX):
        return False
    endpoint = parse_peer(tag[len(PEER_KEY_PREFIX) :])
    return endpoint is not None and endpoint not in connected


def _drop_unfetched(session: ClientSession, query: OpenQuery) -> None:
    """Free a result nobody will fetch: its engine (with the DuckDB and scan threads it holds) and its slot."""
    query.cancel("unfetched")
    if query.finish_if_waiting():
        session.open.pop(query.handle, None)
        log.info("dropped a result whose DoGet did not come (client gone or past unfetched_result_seconds)")


def _client_gone(context: Any) -> bool:
    try:
        return bool(context.is_cancelled())
    except Exception:  # a finished call's context may refuse; then the stream is over anyway
        return False
