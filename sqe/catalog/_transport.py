"""HTTP transport for catalog requests: timeouts and the retry policy, as a requests adapter.

This is the seam every catalog request goes through (pyiceberg's RestCatalog calls included), so the retry
rules live in one place:

- 429: retried for every method;
- 503 with ``Retry-After``: retried for every method;
- 500, 502, 503, 504, 408 and connection errors: retried only for idempotent methods;
- every other 4xx (422 included) is never retried.

The environment (``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY`` and ``REQUESTS_CA_BUNDLE`` /
``CURL_CA_BUNDLE``) is read once, when the session is made, instead of on every request (requests' own
``trust_env`` re-reads it per request: ~0.2-0.7 ms of a warm query's fixed cost). The per-host proxy decision
is requests' own rule, applied to that snapshot and kept per host. ``~/.netrc`` is not consulted: every catalog
request carries SQE's own bearer token or client credentials, never a netrc password.

Backoff is exponential with up to 10 % jitter, and ``Retry-After`` (seconds or an HTTP date) wins when present.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import os
import random
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.utils import should_bypass_proxies
from tenacity import RetryCallState, Retrying, retry_if_exception_type, retry_if_result, stop_after_attempt

if TYPE_CHECKING:
    from sqe.config import SQEConfig

log = logging.getLogger("sqe.catalog")

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_IF_IDEMPOTENT = frozenset({500, 502, 503, 504, 408})


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0
    timeout: float = 30.0

    @classmethod
    def of(cls, config: SQEConfig) -> RetryPolicy:
        """The policy ``[catalog] max_retries`` and ``request_timeout_seconds`` set."""
        return cls(max_retries=config.catalog.max_retries, timeout=config.catalog.request_timeout_seconds)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Parse ``Retry-After`` (delta seconds or an HTTP date) into seconds from now."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # str.isdigit alone takes "²", which float() refuses
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, float(when.timestamp()) - (time.time() if now is None else now))


def should_retry_response(method: str, response: requests.Response) -> bool:
    status = response.status_code
    if status == 429:
        return True
    if status == 503 and response.headers.get("Retry-After"):
        return True
    return status in RETRY_IF_IDEMPOTENT and method.upper() in IDEMPOTENT_METHODS


def backoff_delay(attempt: int, policy: RetryPolicy, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, policy.max_delay)
    delay = min(policy.max_delay, policy.base_delay * 2.0 ** (attempt - 1))
    return delay + random.uniform(0, delay * 0.1)


class RetryingAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` that applies ``RetryPolicy`` and a default timeout to every request."""

    def __init__(self, policy: RetryPolicy) -> None:
        super().__init__(max_retries=0)
        self.policy = policy

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.policy.timeout
        method = (request.method or "GET").upper()
        idempotent = method in IDEMPOTENT_METHODS
        # The first attempt runs outside tenacity (whose per-call setup is a noticeable part of a warm query's
        # cost); only an outcome the policy retries enters the retry loop, which replays it as its attempt 1.
        try:
            first = super().send(request, **kwargs)
        except requests.ConnectionError as exc:
            if not idempotent:
                raise
            return self._retried(request, kwargs, method, idempotent, exc)
        if not should_retry_response(method, first):
            return first
        return self._retried(request, kwargs, method, idempotent, first)

    def _retried(
        self,
        request: requests.PreparedRequest,
        kwargs: dict[str, Any],
        method: str,
        idempotent: bool,
        first: requests.Response | requests.ConnectionError,
    ) -> requests.Response:
        """The retry loop, with ``first`` (the first attempt's response or connection error) as its attempt 1."""
        replay: list[requests.Response | requests.ConnectionError] = [first]

        def attempt() -> requests.Response:
            if replay:
                outcome = replay.pop()
                if isinstance(outcome, requests.ConnectionError):
                    raise outcome
                return outcome
            sent: requests.Response = super(RetryingAdapter, self).send(request, **kwargs)
            return sent

        def wait(state: RetryCallState) -> float:
            outcome = state.outcome
            retry_after = None
            if outcome is not None and not outcome.failed:
                retry_after = retry_after_seconds(outcome.result().headers.get("Retry-After"))
            delay = backoff_delay(state.attempt_number, self.policy, retry_after)
            log.debug(
                "retrying %s %s in %.2fs (attempt %d)",
                method,
                request.path_url.split("?")[0],
                delay,
                state.attempt_number,
            )
            return delay

        def release(state: RetryCallState) -> None:
            # Runs only when another attempt follows: the answer being retried is read to its end and closed, so
            # its connection goes back to the pool (the last answer, retried or not, is the caller's to read).
            outcome = state.outcome
            if outcome is not None and not outcome.failed:
                _release(outcome.result())

        retry_on_error = (
            retry_if_exception_type(requests.ConnectionError) if idempotent else retry_if_result(lambda _r: False)
        )
        retrying = Retrying(
            stop=stop_after_attempt(self.policy.max_retries + 1),
            wait=wait,
            before_sleep=release,
            retry=retry_if_result(lambda r: should_retry_response(method, r)) | retry_on_error,
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,  # type: ignore[union-attr]
            reraise=True,
        )
        response: requests.Response = retrying(attempt)
        return response


def _release(response: requests.Response) -> None:
    """Drain a small answer that will not be used (so its keep-alive connection is reused) and close it."""
    with contextlib.suppress(requests.RequestException, RuntimeError):  # unreadable: closing drops the connection
        response.content  # noqa: B018  # read for its side effect: the body is consumed
    response.close()


class EnvironmentSnapshotSession(requests.Session):
    """A requests session that honours the proxy and CA-bundle environment as read when it was made."""

    def __init__(self) -> None:
        super().__init__()
        self.trust_env = False  # no per-request environment lookups (and no ~/.netrc)
        self._environment_proxies = urllib.request.getproxies()  # what requests would read
        # NO_PROXY as requests reads it (``no_proxy or NO_PROXY``): the table above drops "no" for an empty
        # lowercase variable even when the uppercase one names hosts.
        self._no_proxy = os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
        ca_bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if ca_bundle:
            self.verify = ca_bundle  # requests' own precedence: explicit per-request verify still wins
        self._proxies_by_origin: dict[str, dict[str, str]] = {}
        self._proxies_lock = threading.Lock()

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
        text = url.decode() if isinstance(url, bytes) else str(url or "")
        merged = super().merge_environment_settings(text, proxies, stream, verify, cert)
        environment = self._proxies_for(text)
        if environment:  # as requests does: the environment fills in what the request and session left unset
            merged["proxies"] = {**environment, **(merged.get("proxies") or {})}
        return merged

    def _proxies_for(self, url: str) -> dict[str, str]:
        """The snapshot's proxies for ``url``'s origin, or none when its ``NO_PROXY`` bypasses that host."""
        if not self._environment_proxies:
            return {}
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        with self._proxies_lock:
            found = self._proxies_by_origin.get(origin)
            if found is None:
                bypass = should_bypass_proxies(url, no_proxy=self._no_proxy)
                found = {} if bypass else dict(self._environment_proxies)
                self._proxies_by_origin[origin] = found
            return found


class KeptSession(EnvironmentSnapshotSession):
    """A session that a ``with`` block leaves open: only its owner's ``close()`` closes it (and its pool)."""

    def __exit__(self, *exc_info: object) -> None:
        pass


def make_session(policy: RetryPolicy, *, kept: bool = False) -> requests.Session:
    """A session with the retry policy; ``kept``: a :class:`KeptSession`."""
    session = KeptSession() if kept else EnvironmentSnapshotSession()
    adapter = RetryingAdapter(policy)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
