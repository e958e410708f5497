"""A warehouse's first catalog token, requested on a thread while the REST client is imported.

A cold process's first catalog call waits for pyiceberg's REST client to import (most of a second), then for the
OAuth token (the catalog checks the client secret: about 90 ms at sqe-catalog's default cost, plus the exchange for
a trusted reader). Neither needs the other, so the lazy provider (``sqe.catalog.lazy``) builds the warehouse's
token session and auth first (``requests`` only), starts their first token request on a thread, and imports the
client meanwhile. The client then uses that very session and auth: the token is the one it would have fetched,
nothing is requested twice, and a refusal or transport error is raised by :meth:`EarlyToken.wait` where the client
would have raised it (``SQERestCatalog.__init__``), typed and translated the same way.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqe._unpicklable import Unpicklable
from sqe.catalog._delegation import catalog_auth
from sqe.catalog._transport import RetryPolicy, make_session

if TYPE_CHECKING:
    import requests

    from sqe.catalog._auth import BearerAuth
    from sqe.config import SQEConfig

__all__ = ["EarlyToken"]


@dataclass(repr=False, eq=False)
class EarlyToken(Unpicklable):
    """The token session and auth of ``warehouse``, with their first token being fetched on a daemon thread."""

    warehouse: str
    session: requests.Session
    auth: BearerAuth
    _fetched: Future[None] = field(default_factory=Future)

    _pickle_refusal = "catalog credentials cannot be pickled"

    def __repr__(self) -> str:
        return f"EarlyToken(warehouse={self.warehouse!r}, auth={self.auth!r})"

    @classmethod
    def start(cls, config: SQEConfig, warehouse: str | None = None) -> EarlyToken:
        """Begin fetching the token of ``warehouse`` (default: the primary one) as its catalog client would."""
        endpoint = config.catalog.connection(warehouse)
        session = make_session(RetryPolicy.of(config))
        early = cls(endpoint.warehouse, session, catalog_auth(session, endpoint))
        threading.Thread(target=early._fetch, name="sqe-catalog-token", daemon=True).start()
        return early

    def _fetch(self) -> None:
        try:
            self.auth.current_token()  # kept in the auth (under its lock) for the client's first request
        except BaseException as exc:  # raised by wait(), in the caller's thread, as the client would have
            self._fetched.set_exception(exc)
        else:
            self._fetched.set_result(None)

    def wait(self) -> None:
        """Until the first token is fetched; raises what fetching it raised."""
        self._fetched.result()
