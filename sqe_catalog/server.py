"""``sqe-catalog serve``: the REST catalog under uvicorn, with logging that never carries secrets.

Only the ``sqe_catalog`` and ``uvicorn`` loggers follow ``server.log_level``; every other library stays at
WARNING, because their DEBUG output can include request parameters (SQLAlchemy), raw STS responses (botocore)
or headers (urllib3). uvicorn's access log is off: the catalog logs one line per request itself, without query
strings, headers or bodies. uvicorn handles SIGTERM and SIGINT with a graceful shutdown (in-flight requests
finish, then the database engine is disposed).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType

import uvicorn

from sqe._process import Started, nothing
from sqe_catalog.api import create_app
from sqe_catalog.config import CatalogServerConfig
from sqe_catalog.errors import ConfigError

__all__ = ["configure_logging", "serve"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_OWN_LOGGERS = ("sqe_catalog", "uvicorn", "uvicorn.error")


def log_level(config: CatalogServerConfig) -> int:
    level = _LEVELS.get(config.server.log_level.lower())
    if level is None:
        raise ConfigError(f"server.log_level must be one of {', '.join(_LEVELS)}")
    return level


def configure_logging(level: int) -> None:
    """Our loggers at ``level`` to stderr; the root (every third-party library) at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in _OWN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.setLevel(level)
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True


def _exit_after_graceful_shutdown(_signum: int, _frame: FrameType | None) -> None:
    # uvicorn captures SIGTERM, drains, runs the lifespan shutdown, then re-raises the signal to the handler
    # it found: this one. Everything is closed by then, so a SIGTERM stop is a clean exit (status 0).
    raise SystemExit(0)


def serve(config: CatalogServerConfig, *, started: Started = nothing) -> None:
    """Run until SIGTERM/SIGINT; both drain in-flight requests before the process exits. ``started``: called
    once the app is built, before it serves (see ``sqe._process``)."""
    level = log_level(config)
    configure_logging(level)
    # Ceph RGW rejects the AWS SDK's default request checksums on streamed uploads (metadata writes).
    os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")
    app = create_app(config)
    started()
    server_config = uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        log_config=None,  # keep the configuration above
        log_level=level,
        access_log=False,
        lifespan="on",
        server_header=False,
        timeout_keep_alive=config.server.keep_alive_seconds,
        timeout_graceful_shutdown=int(config.server.request_timeout_seconds) or None,
    )
    logging.getLogger("sqe_catalog").info(
        "sqe-catalog serving %d warehouse(s) on http://%s:%d",
        len(config.warehouses),
        config.server.host,
        config.server.port,
    )
    signal.signal(signal.SIGTERM, _exit_after_graceful_shutdown)
    uvicorn.Server(server_config).run()
