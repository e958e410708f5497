"""The one credential model: ``CredentialSet`` and its non-secret ``StorageSettings``, parsed once from a response.

A load-table (or credentials-endpoint) response is read here and nowhere else. Parsing is strict: a malformed
entry, flag, timeout or expiry raises ``CatalogProtocolError`` naming the field, never a value. The local FileIO
(``sqe.credentials.fileio``), the coordinator's tickets and pushes, and the worker all use these objects; the
worker protocol only converts them to and from protobuf.

Two rules live here:

- *usable*: a catalog entry counts only with an S3 key pair (keyless, ``fs.*``, GCS or ADLS entries never
  shadow a working one);
- *complete* (what a ticket or a push needs): a vended set has key, secret, session token **and** expiry; a
  static set has key and secret. A set without expiry is never given a made-up one. Its prefix is an S3
  location (never ``file://`` or another store's scheme).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sqe._text import redact_credentials
from sqe._unpicklable import Unpicklable
from sqe.credentials.expiry import is_expired
from sqe.credentials.paths import canonical_prefix
from sqe.errors import CatalogProtocolError
from sqe.locations import is_object_store
from sqe.vocabulary import (
    CLIENT_REGION,
    S3_ACCESS_KEY_ID,
    S3_CONNECT_TIMEOUT,
    S3_ENDPOINT,
    S3_FORCE_VIRTUAL_ADDRESSING,
    S3_PATH_STYLE_ACCESS,
    S3_REGION,
    S3_REQUEST_TIMEOUT,
    S3_SECRET_ACCESS_KEY,
    S3_SESSION_TOKEN,
    S3_SESSION_TOKEN_EXPIRES_AT_MS,
    STORAGE_CREDENTIALS,
)

SetSource = Literal["vended", "static"]

CREDENTIAL_KEYS = (S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN)
SETTING_KEYS = (S3_ENDPOINT, S3_REGION, S3_FORCE_VIRTUAL_ADDRESSING, S3_CONNECT_TIMEOUT, S3_REQUEST_TIMEOUT)
# The only keys that ever reach pyiceberg's PyArrowFileIO. Everything else a response carries (py-io-impl,
# s3.retry-strategy-impl, s3.proxy-uri, s3.signer*, s3.role-arn, s3.anonymous, client.* credentials, ...)
# is dropped: several of those import classes or redirect signed requests.
FILEIO_ALLOWLIST = frozenset(CREDENTIAL_KEYS + SETTING_KEYS)

_BOOLEAN_TEXT = {"true": True, "false": False}
_EARLIEST_EXPIRY_MS = 10**11  # March 1973: any smaller expiry is epoch seconds (or nonsense), not milliseconds
# The last millisecond of year 9999: later is no date Python (EXPLAIN, logs) can show, nor an int64 a ticket can carry.
_LATEST_EXPIRY_MS = 253_402_300_799_999

# The completeness rule, as the parts it names: a vended set needs all four, a static set the first two.
VENDED_PARTS = ("access key id", "secret access key", "session token", "expiry")
STATIC_PARTS = VENDED_PARTS[:2]


# --------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class StorageSettings:
    """Non-secret FileIO settings. Timeouts stay the (validated) text the catalog sent."""

    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    connect_timeout: str | None = None
    request_timeout: str | None = None

    def overlay(self, other: StorageSettings) -> StorageSettings:
        """These settings with every value ``other`` sets on top."""
        changes = {
            f.name: getattr(other, f.name) for f in dataclasses.fields(other) if getattr(other, f.name) is not None
        }
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        # The endpoint may be the catalog's, as sent: a password or token parameter in it is not shown.
        shown = (f"{f.name}={redact_credentials(repr(getattr(self, f.name)))}" for f in dataclasses.fields(self))
        return f"StorageSettings({', '.join(shown)})"

    def to_properties(self) -> dict[str, str]:
        """As FileIO properties, in the spelling pyarrow reads (path style as ``s3.force-virtual-addressing``)."""
        properties: dict[str, str] = {}
        if self.endpoint:
            properties[S3_ENDPOINT] = self.endpoint
        if self.region:
            properties[S3_REGION] = self.region
        if self.path_style is not None:
            properties[S3_FORCE_VIRTUAL_ADDRESSING] = "false" if self.path_style else "true"
        if self.connect_timeout:
            properties[S3_CONNECT_TIMEOUT] = self.connect_timeout
        if self.request_timeout:
            properties[S3_REQUEST_TIMEOUT] = self.request_timeout
        return properties


# ------------------------------------------------------------------------------------------ credential sets


@dataclass(frozen=True)
class CredentialSet(Unpicklable):
    """One key set with the prefix it covers. Keys stay out of the repr; never pickled.

    ``prefix`` is None for keys the catalog sent in the response ``config`` (they cover the whole table).
    """

    prefix: str | None
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    expires_at_ms: int | None = None
    source: SetSource = "vended"
    settings: StorageSettings = field(default_factory=StorageSettings)

    _pickle_refusal = "CredentialSet holds secrets and cannot be pickled"

    @property
    def expires_at(self) -> float | None:
        """Epoch seconds; None for a set without expiry."""
        return None if self.expires_at_ms is None else self.expires_at_ms / 1000.0

    @property
    def pair(self) -> tuple[str, str]:
        return self.access_key_id, self.secret_access_key

    def keys(self) -> dict[str, str]:
        """The FileIO credential keys of this set (taken whole: keys of two sets never mix)."""
        keys = {S3_ACCESS_KEY_ID: self.access_key_id, S3_SECRET_ACCESS_KEY: self.secret_access_key}
        if self.session_token:
            keys[S3_SESSION_TOKEN] = self.session_token
        return keys

    def missing_parts(self) -> list[str]:
        """What this set lacks to be complete (:data:`VENDED_PARTS` or :data:`STATIC_PARTS`), in that order."""
        values = (self.access_key_id, self.secret_access_key, self.session_token, self.expires_at_ms)
        present = dict(zip(VENDED_PARTS, values, strict=True))
        required = STATIC_PARTS if self.source == "static" else VENDED_PARTS
        return [name for name in required if not present[name]]

    def covers_object_store(self) -> bool:
        """Whether the prefix names an S3 location (``s3://``, ``s3a://``, ``s3n://``).

        A ticket or a push with any other prefix (``file://``, ``gs://``, a bare path) is refused: keys are for the
        object store, and a worker must never be steered to read its own local files.
        """
        return self.prefix is not None and is_object_store(self.prefix)  # the scheme alone: nothing to parse

    def is_expired(self, now: float | None = None) -> bool:
        return is_expired(self.expires_at_ms, now)

    def with_prefix(self, prefix: str) -> CredentialSet:
        return dataclasses.replace(self, prefix=prefix)

    def with_settings(self, settings: StorageSettings) -> CredentialSet:
        return dataclasses.replace(self, settings=settings)


@dataclass(frozen=True)
class CatalogCredentials:
    """What one response vended: its ``config`` settings and every usable key set (config's first, if any).

    Each set's settings are the response ``config`` settings with its own entry's on top.
    """

    settings: StorageSettings = field(default_factory=StorageSettings)
    sets: tuple[CredentialSet, ...] = field(default=(), repr=False)

    def for_location(self, location: str) -> tuple[CredentialSet, ...]:
        """The sets with the config-level one (no prefix of its own) scoped to ``location``, the table root."""
        return tuple(s if s.prefix is not None else s.with_prefix(location) for s in self.sets)


# ---------------------------------------------------------------------------------------------- parsing


def parse_catalog_credentials(response: Mapping[str, Any], what: str = "load-table response") -> CatalogCredentials:
    """The settings and usable sets of a load-table or credentials-endpoint JSON answer; strict."""
    config = parse_string_map(response.get("config"), "config", what)
    settings = parse_settings(config, "config", what)
    sets: list[CredentialSet] = []
    config_set = _set_from(config, None, settings, "config", what)
    if config_set is not None:
        sets.append(config_set)
    by_prefix: dict[str, CredentialSet] = {}
    for i, (prefix, entry) in enumerate(parse_storage_credentials(response.get(STORAGE_CREDENTIALS), what)):
        where = f"storage-credentials prefix {prefix!r}"
        if not has_key_pair(entry):
            continue  # unusable (keyless, fs.*, GCS, ADLS): never shadows a working set, never validated
        entry_settings = settings.overlay(parse_settings(entry, where, what))
        found = _set_from(entry, prefix, entry_settings, where, what)
        if found is None:
            continue
        # Two different sets for one prefix: which the catalog meant is unknowable, so neither is guessed.
        earlier = by_prefix.setdefault(canonical_prefix(prefix), found)
        if earlier is not found:
            if earlier != found.with_prefix(earlier.prefix or prefix):
                raise CatalogProtocolError(
                    f"{what}: storage-credentials[{i}] has the same prefix as an earlier entry with other "
                    f"credentials ({prefix!r})"
                )
            continue  # the same set again
        sets.append(found)
    return CatalogCredentials(settings, tuple(sets))


def has_key_pair(raw: Mapping[str, str]) -> bool:
    return bool(raw.get(S3_ACCESS_KEY_ID)) and bool(raw.get(S3_SECRET_ACCESS_KEY))


def parse_string_map(raw: Any, where: str, what: str = "load-table response") -> dict[str, str]:
    """A JSON object of strings to strings (absent means empty)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise CatalogProtocolError(f"{what}: {where} must be an object")
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise CatalogProtocolError(f"{what}: {where} must map strings to strings")
    return dict(raw)


def parse_storage_credentials(raw: Any, what: str = "load-table response") -> tuple[tuple[str, dict[str, str]], ...]:
    """The ``storage-credentials`` list as (prefix, config) pairs, usable or not. Errors name the entry."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise CatalogProtocolError(f"{what}: storage-credentials must be a list")
    parsed = []
    for i, entry in enumerate(raw):
        where = f"storage-credentials[{i}]"
        if not isinstance(entry, Mapping):
            raise CatalogProtocolError(f"{what}: {where} must be an object")
        prefix = entry.get("prefix")
        if not isinstance(prefix, str) or not prefix:
            raise CatalogProtocolError(f"{what}: {where}.prefix must be a non-empty string")
        config = entry.get("config")
        if config is None:  # unlike the response's own config, an entry's config is required
            raise CatalogProtocolError(f"{what}: {where}.config must be an object")
        parsed.append((prefix, parse_string_map(config, f"{where}.config", what)))
    return tuple(parsed)


def parse_settings(raw: Mapping[str, str], where: str, what: str = "load-table response") -> StorageSettings:
    """The allowlisted non-credential keys of one catalog-sent map (``client.region`` and Iceberg Java's
    ``s3.path-style-access`` understood; ``s3.force-virtual-addressing`` wins when both are sent)."""
    path_style: bool | None = None
    if raw.get(S3_FORCE_VIRTUAL_ADDRESSING):
        path_style = not _parse_bool(raw[S3_FORCE_VIRTUAL_ADDRESSING], S3_FORCE_VIRTUAL_ADDRESSING, where, what)
    elif S3_PATH_STYLE_ACCESS in raw:
        path_style = _parse_bool(raw[S3_PATH_STYLE_ACCESS], S3_PATH_STYLE_ACCESS, where, what)
    timeouts = {key: raw.get(key) or None for key in (S3_CONNECT_TIMEOUT, S3_REQUEST_TIMEOUT)}
    for key, text in timeouts.items():
        if text is not None:
            _check_positive_number(text, key, where, what)
    return StorageSettings(
        endpoint=raw.get(S3_ENDPOINT) or None,
        region=raw.get(S3_REGION) or raw.get(CLIENT_REGION) or None,
        path_style=path_style,
        connect_timeout=timeouts[S3_CONNECT_TIMEOUT],
        request_timeout=timeouts[S3_REQUEST_TIMEOUT],
    )


def _set_from(
    raw: Mapping[str, str], prefix: str | None, settings: StorageSettings, where: str, what: str
) -> CredentialSet | None:
    """The whole vended set of one source, or None when it has no usable key pair."""
    if not has_key_pair(raw):
        return None
    return CredentialSet(
        prefix=prefix,
        access_key_id=raw[S3_ACCESS_KEY_ID],
        secret_access_key=raw[S3_SECRET_ACCESS_KEY],
        session_token=raw.get(S3_SESSION_TOKEN) or None,
        expires_at_ms=_parse_expiry(raw, where, what),
        source="vended",
        settings=settings,
    )


def _parse_bool(text: str, key: str, where: str, what: str) -> bool:
    value = _BOOLEAN_TEXT.get(text.strip().lower())
    if value is None:
        raise CatalogProtocolError(f"{what}: {where} {key} must be true or false")
    return value


def _check_positive_number(text: str, key: str, where: str, what: str) -> None:
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if not number > 0:
        raise CatalogProtocolError(f"{what}: {where} {key} must be a positive number")


def _parse_expiry(raw: Mapping[str, str], where: str, what: str) -> int | None:
    text = raw.get(S3_SESSION_TOKEN_EXPIRES_AT_MS)
    if not text:
        return None
    signed = text.strip()
    digits = signed.removeprefix("-")
    # ASCII digits only: int() would also take "1_800_000_000_000" or other scripts' digits.
    if not (digits.isascii() and digits.isdigit()):
        message = f"{what}: {where} {S3_SESSION_TOKEN_EXPIRES_AT_MS} must be an integer"
        raise CatalogProtocolError(message)
    # Compared as text first: int() raises ValueError for over 4300 digits (leading zeros count too).
    significant = digits.lstrip("0") or "0"
    magnitude = int(significant) if len(significant) <= len(str(_LATEST_EXPIRY_MS)) else _LATEST_EXPIRY_MS + 1
    value = -magnitude if signed.startswith("-") else magnitude
    if value > _LATEST_EXPIRY_MS:
        message = f"{what}: {where} {S3_SESSION_TOKEN_EXPIRES_AT_MS} must be epoch milliseconds before year 10000"
        raise CatalogProtocolError(message)
    if value < _EARLIEST_EXPIRY_MS:
        # Epoch seconds read as milliseconds land in 1970: "already expired" would hide the catalog's mistake.
        message = f"{what}: {where} {S3_SESSION_TOKEN_EXPIRES_AT_MS} must be epoch milliseconds (seconds sent?)"
        raise CatalogProtocolError(message)
    return value
