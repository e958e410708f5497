"""Per-file FileIO properties from a load-table response (the core of SQE's credential handling).

For one data file path the properties are built in a fixed order, from an allowlist of S3 keys only:

1. the response ``config``;
2. the usable ``storage-credentials`` entry with the longest prefix covering the path on a segment boundary
   (``s3a://``/``s3n://`` count as ``s3://``); with no match, ``config`` alone stands;
3. SQE's own settings: endpoint, region (always set), path style, and in static mode the ``[storage]`` pair;
4. if the catalog vended credential keys, exactly those go on top and every local credential key is removed,
   so static and vended keys never mix.

Table metadata properties are not an input at all: a table cannot choose the endpoint, a FileIO class or a
retry class. The vended key set is taken whole from one source (the matched entry, else ``config``), so keys
from two vended sets never mix either. A vended pair equal to SQE's static pair is treated as static.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn

from sqe.config import SQEConfig
from sqe.credentials.expiry import CredentialSource
from sqe.credentials.paths import is_object_store, prefix_length, prefix_matches
from sqe.errors import CatalogProtocolError, NoVendedCredentialsError

ACCESS_KEY_ID = "s3.access-key-id"
SECRET_ACCESS_KEY = "s3.secret-access-key"
SESSION_TOKEN = "s3.session-token"
EXPIRES_AT_MS = "s3.session-token-expires-at-ms"  # metadata: read by SQE, never passed to pyarrow
ENDPOINT = "s3.endpoint"
REGION = "s3.region"
FORCE_VIRTUAL_ADDRESSING = "s3.force-virtual-addressing"
CONNECT_TIMEOUT = "s3.connect-timeout"
REQUEST_TIMEOUT = "s3.request-timeout"

CREDENTIAL_KEYS = (ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN)
SETTING_KEYS = (ENDPOINT, REGION, FORCE_VIRTUAL_ADDRESSING, CONNECT_TIMEOUT, REQUEST_TIMEOUT)
# The only keys that ever reach pyiceberg's PyArrowFileIO. Everything else a response carries (py-io-impl,
# s3.retry-strategy-impl, s3.proxy-uri, s3.signer*, s3.role-arn, s3.anonymous, client.* credentials, ...)
# is dropped: several of those import classes or redirect signed requests.
FILEIO_ALLOWLIST = frozenset(CREDENTIAL_KEYS + SETTING_KEYS)

_PATH_STYLE_ACCESS = "s3.path-style-access"  # Iceberg Java's spelling; pyarrow wants the inverse
_CLIENT_REGION = "client.region"
_BOOLEAN_TEXT = {"true": True, "false": False}


# ----------------------------------------------------------------------------------- storage credentials


@dataclass(frozen=True)
class StorageCredential:
    """One ``storage-credentials`` entry. ``config`` holds secrets and stays out of the repr."""

    prefix: str
    config: Mapping[str, str] = field(repr=False)

    @property
    def is_usable(self) -> bool:
        """Only S3 key pairs count: keyless, ``fs.*``, GCS or ADLS entries must not shadow a working one."""
        return bool(self.config.get(ACCESS_KEY_ID)) and bool(self.config.get(SECRET_ACCESS_KEY))

    def __reduce__(self) -> NoReturn:
        raise TypeError("StorageCredential holds secrets and cannot be pickled")


def _string_map(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        raise CatalogProtocolError(f"load-table response: {where} must be an object")
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise CatalogProtocolError(f"load-table response: {where} must map strings to strings")
    return dict(raw)


def parse_response_config(raw: Any) -> dict[str, str]:
    """The response's ``config`` map (absent means empty)."""
    return {} if raw is None else _string_map(raw, "config")


def parse_storage_credentials(raw: Any) -> tuple[StorageCredential, ...]:
    """The response's ``storage-credentials`` list. Errors name the entry, never a value."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise CatalogProtocolError("load-table response: storage-credentials must be a list")
    parsed = []
    for i, entry in enumerate(raw):
        where = f"storage-credentials[{i}]"
        if not isinstance(entry, Mapping):
            raise CatalogProtocolError(f"load-table response: {where} must be an object")
        prefix = entry.get("prefix")
        if not isinstance(prefix, str) or not prefix:
            raise CatalogProtocolError(f"load-table response: {where}.prefix must be a non-empty string")
        config = _string_map(entry.get("config"), f"{where}.config")
        parsed.append(StorageCredential(prefix, MappingProxyType(config)))
    return tuple(parsed)


def select_credential(path: str, creds: Iterable[StorageCredential]) -> StorageCredential | None:
    """The usable entry with the longest prefix covering ``path``; the first one wins a tie."""
    usable = [cred for cred in creds if cred.is_usable and prefix_matches(path, cred.prefix)]
    # max() keeps the first of equally long prefixes.
    return max(usable, key=lambda cred: prefix_length(cred.prefix), default=None)


# ------------------------------------------------------------------------------------ resolved properties


@dataclass(frozen=True)
class ResolvedCredentials:
    """FileIO properties for one path. ``properties`` holds secrets and stays out of the repr."""

    properties: Mapping[str, str] = field(repr=False)
    source: CredentialSource
    prefix: str | None  # the storage-credentials prefix that matched; None for config or local keys
    expires_at_ms: int | None

    @property
    def cache_key(self) -> frozenset[tuple[str, str]]:
        return frozenset(self.properties.items())

    def __reduce__(self) -> NoReturn:
        raise TypeError("ResolvedCredentials holds secrets and cannot be pickled")


@dataclass(frozen=True)
class VendedSet:
    """One catalog-vended key set, taken whole from one source. ``keys`` holds secrets."""

    keys: Mapping[str, str] = field(repr=False)
    prefix: str | None  # the storage-credentials prefix; None when the keys came in the response config
    expires_at_ms: int | None

    def __reduce__(self) -> NoReturn:
        raise TypeError("VendedSet holds secrets and cannot be pickled")


def _settings_from(raw: Mapping[str, str], where: str) -> dict[str, str]:
    """Allowlisted non-credential keys of a catalog-sent map, translated to the spelling pyarrow reads."""
    settings = {key: raw[key] for key in SETTING_KEYS if raw.get(key)}
    if REGION not in settings and raw.get(_CLIENT_REGION):
        settings[REGION] = raw[_CLIENT_REGION]
    if FORCE_VIRTUAL_ADDRESSING not in settings and _PATH_STYLE_ACCESS in raw:
        path_style = _parse_bool(raw[_PATH_STYLE_ACCESS], _PATH_STYLE_ACCESS, where)
        settings[FORCE_VIRTUAL_ADDRESSING] = "false" if path_style else "true"
    if FORCE_VIRTUAL_ADDRESSING in settings:
        virtual = _parse_bool(settings[FORCE_VIRTUAL_ADDRESSING], FORCE_VIRTUAL_ADDRESSING, where)
        settings[FORCE_VIRTUAL_ADDRESSING] = "true" if virtual else "false"
    for key in (CONNECT_TIMEOUT, REQUEST_TIMEOUT):
        if key in settings:
            _parse_positive_number(settings[key], key, where)
    return settings


def _parse_bool(text: str, key: str, where: str) -> bool:
    value = _BOOLEAN_TEXT.get(text.strip().lower())
    if value is None:
        raise CatalogProtocolError(f"load-table response: {where} {key} must be true or false")
    return value


def _parse_positive_number(text: str, key: str, where: str) -> float:
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if not number > 0:
        raise CatalogProtocolError(f"load-table response: {where} {key} must be a positive number")
    return number


def _parse_expiry(raw: Mapping[str, str], where: str) -> int | None:
    text = raw.get(EXPIRES_AT_MS)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        message = f"load-table response: {where} {EXPIRES_AT_MS} must be an integer"
        raise CatalogProtocolError(message) from None


def _vended_from(raw: Mapping[str, str], prefix: str | None, where: str) -> VendedSet | None:
    """The whole credential set of one source, or None when it has no usable key pair."""
    if not (raw.get(ACCESS_KEY_ID) and raw.get(SECRET_ACCESS_KEY)):
        return None
    keys = {key: raw[key] for key in CREDENTIAL_KEYS if raw.get(key)}
    return VendedSet(MappingProxyType(keys), prefix, _parse_expiry(raw, where))


def _is_static_pair(vended: VendedSet, config: SQEConfig) -> bool:
    pair = config.static_key_pair()
    return pair is not None and (vended.keys[ACCESS_KEY_ID], vended.keys[SECRET_ACCESS_KEY]) == pair


def _local_settings(config: SQEConfig, catalog_region: str | None) -> dict[str, str]:
    storage = config.storage
    settings = {REGION: storage.region or catalog_region or storage.DEFAULT_REGION}
    if storage.endpoint:
        settings[ENDPOINT] = storage.endpoint
    if storage.path_style is not None:
        settings[FORCE_VIRTUAL_ADDRESSING] = "false" if storage.path_style else "true"
    return settings


def _static_keys(config: SQEConfig) -> dict[str, str]:
    """The ``[storage]`` pair (static mode only); empty under require_vended_credentials or without a pair."""
    pair = config.static_key_pair()
    if pair is None or config.catalog.require_vended_credentials:
        return {}
    keys = {ACCESS_KEY_ID: pair[0], SECRET_ACCESS_KEY: pair[1]}
    session_token = config.storage.session_token_value()
    if session_token:
        keys[SESSION_TOKEN] = session_token
    return keys


def _where(cred: StorageCredential) -> str:
    return f"storage-credentials prefix {cred.prefix!r}"


def _vended_set_for(
    path: str, response_config: Mapping[str, str], creds: Sequence[StorageCredential], config: SQEConfig
) -> tuple[StorageCredential | None, VendedSet | None, bool]:
    """(matched entry, vended set that applies, whether a vended pair was rejected as the static one)."""
    matched = select_credential(path, creds)
    if matched is not None:
        vended = _vended_from(matched.config, matched.prefix, _where(matched))
    else:
        vended = _vended_from(response_config, None, "config")
    if vended is not None and _is_static_pair(vended, config):
        return matched, None, True
    return matched, vended, False


def vended_sets(
    response_config: Mapping[str, str], creds: Sequence[StorageCredential], config: SQEConfig
) -> tuple[VendedSet, ...]:
    """Every vended set in a response (config first), minus those that are really SQE's static pair.

    Also validates every catalog-sent value up front, so a malformed response fails at load time.
    """
    found = [_vended_from(response_config, None, "config")]
    _settings_from(response_config, "config")
    for cred in creds:
        if cred.is_usable:
            found.append(_vended_from(cred.config, cred.prefix, _where(cred)))
            _settings_from(cred.config, _where(cred))
    return tuple(v for v in found if v is not None and not _is_static_pair(v, config))


def build_properties(
    path: str,
    response_config: Mapping[str, str],
    creds: Sequence[StorageCredential],
    config: SQEConfig,
) -> ResolvedCredentials:
    """FileIO properties for the data file ``path``, merged in the documented order."""
    matched, vended, was_static_pair = _vended_set_for(path, response_config, creds, config)
    # (1) response config, (2) matched storage credential: allowlisted settings only.
    properties = _settings_from(response_config, "config")
    if matched is not None:
        properties.update(_settings_from(matched.config, _where(matched)))
    # (3) SQE's own settings win over the catalog's; static keys only in static mode.
    properties.update(_local_settings(config, properties.get(REGION)))
    properties.update(_static_keys(config))
    # (4) vended keys on top; every local credential key the catalog did not vend goes.
    if vended is not None:
        for key in CREDENTIAL_KEYS:
            properties.pop(key, None)
        properties.update(vended.keys)
    elif config.catalog.require_vended_credentials and is_object_store(path):
        _raise_no_vended(path, was_static_pair)
    return ResolvedCredentials(
        properties=MappingProxyType(properties),
        source=_source(vended, properties),
        prefix=vended.prefix if vended is not None else None,
        expires_at_ms=vended.expires_at_ms if vended is not None else None,
    )


def _source(vended: VendedSet | None, properties: Mapping[str, str]) -> CredentialSource:
    if vended is not None:
        return "vended"
    return "static" if ACCESS_KEY_ID in properties else "none"


def _raise_no_vended(path: str, was_static_pair: bool) -> NoReturn:
    if was_static_pair:
        detail = "the catalog returned SQE's own static key, which is never treated as vended"
    else:
        detail = "the catalog vended no usable credentials for this location"
    raise NoVendedCredentialsError(
        f"no vended credentials for {path}: {detail}, and catalog.require_vended_credentials = true forbids "
        "static and ambient AWS credentials (does the catalog vend for this warehouse, and is "
        "access delegation enabled there?)"
    )
