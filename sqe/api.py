"""The Python entry point: ``sqe.connect(config=..., **overrides)`` returns a user's ``Session``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqe.catalog.lazy import LazyRestTableProvider
from sqe.config import SQEConfig, load_config
from sqe.session import Session


def connect(config: str | Path | SQEConfig | None = None, **overrides: Any) -> Session:
    """Open a session as the user the config names.

    ``overrides`` use dotted keys with ``__`` for dots or section dicts, e.g.
    ``connect("config.toml", catalog__require_vended_credentials=True)`` or ``connect(catalog={"uri": ...})``.
    """
    if isinstance(config, SQEConfig):
        if overrides:
            raise TypeError("overrides cannot be combined with an SQEConfig object; build the config instead")
        cfg = config
    else:
        cfg = load_config(config, overrides=_normalise(overrides))
    provider = _provider(cfg)
    return Session(provider, cfg, on_close=provider.close)  # the session owns the catalog client it was given


def _provider(cfg: SQEConfig) -> LazyRestTableProvider:
    """The REST catalog client, built on the first catalog call (a statement without tables never imports it)."""
    return LazyRestTableProvider(cfg)


def _normalise(overrides: dict[str, Any]) -> dict[str, Any]:
    return {key.replace("__", "."): value for key, value in overrides.items()}
