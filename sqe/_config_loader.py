"""The one configuration loader behind ``sqe.config`` (engine), ``sqe_catalog.config`` (catalog server) and
``sqe.server.config`` (``sqe serve``).

Each config is a tree of pydantic models (:class:`ConfigSection`: strict, frozen, unknown keys forbidden). This
module adds what pydantic does not do for a config file:

- TOML arrays become tuples (:data:`Array`) and an empty string unsets an optional key (:data:`Unset`);
- ``<PREFIX><SECTION>__<KEY>`` environment variables (or ``<PREFIX><KEY>`` when the prefix names the section) are
  converted by the field's type, explicitly;
- every error is one line naming the dotted key (``catalog.warehouses[1].uri``) and, when the value came from
  the environment or an override, what set it; a rejected value is never echoed (it may be a secret).

Config objects refuse to be pickled (they hold secrets) and copy as themselves (they are immutable).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Self, TypeGuard, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, SecretStr, ValidationError

from sqe._text import escape_unprintable, redact_credentials

_log = logging.getLogger("sqe.config")

_T = TypeVar("_T")
_M = TypeVar("_M", bound="ConfigSection")


def _array_as_tuple(value: Any) -> Any:
    """TOML and JSON arrays arrive as lists; config values are immutable tuples. Anything else fails strictly."""
    return tuple(value) if isinstance(value, list) else value


def _blank_as_none(value: Any) -> Any:
    return None if value == "" else value


# A TOML array of ``_T`` (strict items), held as a tuple.
Array = Annotated[tuple[_T, ...], BeforeValidator(_array_as_tuple)]
# An optional key; ``""`` (in the file, the environment or an override) means unset.
Unset = Annotated[_T | None, BeforeValidator(_blank_as_none)]


class ConfigSection(BaseModel):
    """Base of every config model: strict types, no unknown keys, immutable, never pickled."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        # The same exception a frozen dataclass raises (an AttributeError), not pydantic's ValidationError.
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # A URL setting (a catalog uri, an endpoint) may carry a password or a token parameter: shown without.
        for name, value in super().__repr_args__():
            yield name, _redacted(value)

    def __reduce__(self) -> NoReturn:
        # A pickle would carry the secrets to wherever the bytes go (caches, queues, crash dumps).
        raise TypeError(f"{type(self).__name__} holds secrets and cannot be pickled")

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A NEW, validated model with ``update`` applied (pydantic's own copies through ``__copy__``, which
        returns ``self`` here, and would write ``update`` into this frozen object)."""
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data.update(update or {})
        return type(self).model_validate(data)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact_credentials(value)
    if isinstance(value, tuple):
        return tuple(_redacted(item) for item in value)
    return value


def reveal(secret: SecretStr | None) -> str | None:
    """The plain value of an optional secret: call only where it is handed to signing or authentication."""
    return None if secret is None else secret.get_secret_value()


# ---------------------------------------------------------------------------------------------- errors


class Origins:
    """Remembers which environment variable or override set a key, and raises errors that name both."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self._by_key: dict[str, str] = {}

    def record(self, key: str, origin: str) -> None:
        self._by_key[key] = origin

    def fail(self, key: str, message: str) -> NoReturn:
        origin = self._lookup(key)
        shown = escape_unprintable(key)  # a key comes from user input (override, env name): keep the error on one line
        where = f"{shown} (set by {origin})" if origin else shown
        raise self.error(f"{where}: {message}")

    def _lookup(self, key: str) -> str | None:
        candidate = key
        while candidate:
            if candidate in self._by_key:
                return self._by_key[candidate]
            parent = _PARENT_KEY.sub("", candidate)
            if parent == candidate:  # no parent to strip (e.g. "a." from an override key): never loop forever
                break
            candidate = parent
        # An unknown section named by a dotted override ("catalgo.uri" fails as "catalgo").
        return next((origin for k, origin in self._by_key.items() if k.startswith(key + ".")), None)


_PARENT_KEY = re.compile(r"(\.[^.\[]+|\[\d+\]|^[^.\[]+)$")  # strips the last ".name", "[i]" or the root


def dotted(loc: tuple[int | str, ...]) -> str:
    """``("catalog", "warehouses", 1, "uri")`` -> ``catalog.warehouses[1].uri``."""
    key = ""
    for part in loc:
        key = f"{key}[{part}]" if isinstance(part, int) else (f"{key}.{part}" if key else str(part))
    return key


def short(value: str) -> str:
    """A value for an error message, quoted and cut (only for values that are never secrets)."""
    return json.dumps(value if len(value) <= 40 else value[:37] + "...")


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _non_none(tp: Any) -> Any:
    return next(a for a in typing.get_args(tp) if a is not type(None))


def _tuple_item(tp: Any) -> Any | None:
    return typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else None


def is_section(tp: Any) -> TypeGuard[type[ConfigSection]]:
    return isinstance(tp, type) and issubclass(tp, ConfigSection)


def type_name(tp: Any) -> str:
    """How an error names the type a key expects."""
    if _is_optional(tp):
        return type_name(_non_none(tp))
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(f'"{a}"' for a in typing.get_args(tp))
    item = _tuple_item(tp)
    if item is not None:
        return "an array of tables" if is_section(item) else "a list of strings"
    names = {str: "a string", SecretStr: "a string", int: "an integer", float: "a number"}
    return "a boolean (true/false)" if tp is bool else names.get(tp, "a table")


def value_kind(value: Any) -> str:
    """What a rejected value is, without showing it."""
    if isinstance(value, dict):
        return "a table"
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", tuple: "a list"}
    return kinds.get(type(value), type(value).__name__)


def field_type(model: type[ConfigSection], loc: tuple[int | str, ...]) -> Any:
    """The annotation of the field at ``loc`` (an index selects an array's item), or None if there is none."""
    tp: Any = model
    for part in loc:
        if _is_optional(tp):
            tp = _non_none(tp)
        if isinstance(part, int):
            tp = _tuple_item(tp)
        elif is_section(tp) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        else:
            return None
    return tp


def _choice_message(value: Any, tp: Any, key: str, reasons: Mapping[str, Mapping[str, str]]) -> str:
    choices = typing.get_args(_non_none(tp) if _is_optional(tp) else tp)
    allowed = " or ".join(f'"{c}"' for c in choices)
    if not isinstance(value, str):
        return f"expected one of {allowed}, got {value_kind(value)}"
    reason = reasons.get(key, {}).get(value)
    because = f" ({reason})" if reason else ""
    return f"{short(value)} is not supported{because}; use {allowed}"


def _first_error(exc: ValidationError) -> Any:
    """The error to report: an unknown key first (a typo usually explains a missing key), else the first one."""
    errors = exc.errors(include_url=False)
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


def _raise_validation_error(
    exc: ValidationError, model: type[ConfigSection], origins: Origins, reasons: Mapping[str, Mapping[str, str]]
) -> NoReturn:
    error = _first_error(exc)
    loc, kind, value = tuple(error["loc"]), error["type"], error.get("input")
    key, tp = dotted(loc), field_type(model, loc)
    if kind == "extra_forbidden":
        origins.fail(key, "unknown key")
    if kind == "missing":
        origins.fail(key, "required")
    if kind == "literal_error":
        origins.fail(key, _choice_message(value, tp, key, reasons))
    if tp is not None and kind.endswith("_type"):
        origins.fail(key, f"expected {type_name(tp)}, got {value_kind(value)}")
    origins.fail(key, str(error["msg"]))  # pydantic's own words, which never contain the input


# ------------------------------------------------------------------------------------------- building


def _fill_sections(model: type[ConfigSection], tree: dict[str, Any]) -> None:
    """Absent sections become empty tables, so a missing required key is named (``catalog.uri: required``)."""
    for name, info in model.model_fields.items():
        section = info.annotation
        if not (isinstance(section, type) and issubclass(section, ConfigSection)):
            continue
        if name not in tree:
            tree[name] = {}
        if isinstance(tree[name], dict):
            _fill_sections(section, tree[name])


def build(
    model: type[_M],
    tree: Mapping[str, Any],
    origins: Origins,
    reasons: Mapping[str, Mapping[str, str]] | None = None,
) -> _M:
    """Validates ``tree`` into ``model``; the first problem becomes one ``origins.error`` naming its key.

    ``reasons`` explain refused choices: ``{"catalog.access_delegation": {"remote-signing": "why"}}``.
    """
    data = dict(tree)
    _fill_sections(model, data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        _raise_validation_error(exc, model, origins, reasons or {})


def read_toml(path: str | Path, error: type[Exception], model: type[ConfigSection] | None = None) -> dict[str, Any]:
    """The file's TOML tree. With ``model``, a file holding one of its secrets that other users may read is
    warned about (as ssh and psql do for key and password files): the secret is as good as theirs."""
    try:
        with open(path, "rb") as fh:
            tree = tomllib.load(fh)
            mode = os.fstat(fh.fileno()).st_mode
    except FileNotFoundError:
        raise error(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise error(f"config path is a directory: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except (OSError, ValueError) as exc:  # permissions, a name too long, a NUL in the path
        raise error(f"cannot read config file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    secrets = secret_keys(model, tree) if model is not None and mode & 0o077 else []
    if secrets:
        _log.warning(
            "%s holds %s but other users may read it (mode %o): chmod 600 %s",
            escape_unprintable(str(path)),
            ", ".join(secrets),
            mode & 0o777,
            escape_unprintable(str(path)),
        )
    return tree


def secret_keys(model: type[ConfigSection], tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the secrets (``SecretStr`` fields) set in ``tree``, a file's tree for ``model``."""
    found: list[str] = []
    for name, value in tree.items():
        field = model.model_fields.get(name)
        if field is None or value is None or value == "":
            continue
        tp = _non_none(field.annotation) if _is_optional(field.annotation) else field.annotation
        item = _tuple_item(tp)
        if tp is SecretStr:
            found.append(prefix + name)
        elif is_section(tp) and isinstance(value, Mapping):
            found += secret_keys(tp, value, f"{prefix}{name}.")
        elif is_section(item) and isinstance(value, list):
            for entry in value:
                found += secret_keys(item, entry, f"{prefix}{name}.") if isinstance(entry, Mapping) else []
    return sorted(set(found))


# ------------------------------------------------------------------------------------ env and overrides


def _env_bool(text: str) -> bool | None:
    return {"true": True, "1": True, "false": False, "0": False}.get(text.strip().lower())


def _env_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _env_list(text: str) -> Any:
    stripped = text.strip()
    if stripped.startswith("["):
        return _env_json(stripped)
    return [part.strip() for part in stripped.split(",") if part.strip()]


def _env_number(text: str, kind: type[int] | type[float]) -> int | float | None:
    try:
        return kind(text.strip())
    except ValueError:
        return None


def _parse_env_value(text: str, tp: Any) -> Any:
    """Turns an environment string into the field's type; None when it cannot be parsed."""
    if _is_optional(tp):
        return None if text == "" else _parse_env_value(text, _non_none(tp))
    item = _tuple_item(tp)
    if item is not None:
        return _env_json(text) if is_section(item) else _env_list(text)
    if tp is bool:
        return _env_bool(text)
    if tp in (int, float):
        return _env_number(text, tp)
    return text  # str, SecretStr and Literal choices: validated as given


def _resolve_key(model: type[ConfigSection], parts: list[str]) -> tuple[str, Any] | None:
    """Dotted key and field type for ``parts`` (lower-case names), or None if no such key exists."""
    tp: Any = model
    for part in parts:
        if not is_section(tp) or part not in tp.model_fields:
            return None
        tp = tp.model_fields[part].annotation
    return ".".join(parts), tp


def apply_env(
    tree: dict[str, Any],
    env: Mapping[str, str],
    prefix: str,
    model: type[ConfigSection],
    origins: Origins,
    *,
    section: str | None = None,
) -> None:
    """Applies ``<prefix><SECTION>__<KEY>`` variables (converted by the field's type) on top of ``tree``.

    With ``section``, the prefix itself names that section: ``<prefix><KEY>`` sets ``<section>.<key>`` (``SQE_SERVER_``
    + ``READER_CLIENT_SECRET`` sets ``server.reader_client_secret``; deeper keys still join with ``__``). A variable
    whose key part starts with ``_`` is then left alone, as no field name does: ``SQE_SERVER__X`` is the
    ``<PREFIX><SECTION>__<KEY>`` naming of a loader whose prefix is ``SQE_``.
    """
    for name in sorted(env):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if section is not None:
            if rest.startswith("_"):
                continue
            parts = [section, *(p.lower() for p in rest.split("__"))]
        elif "__" in name:
            parts = [p.lower() for p in rest.split("__")]
        else:
            continue  # e.g. SQE_CONFIG: not a key override
        resolved = _resolve_key(model, parts)
        if resolved is None:
            raise origins.error(f"{name}: unknown key {'.'.join(parts)}")
        key, tp = resolved
        if is_section(tp):
            raise origins.error(f"{name}: {key} is a section; set its keys as {name}__<KEY>")
        value = _parse_env_value(env[name], tp)
        if value is None and not _is_optional(tp):
            raise origins.error(f"{key} (set by {name}): expected {type_name(tp)}")
        origins.record(key, name)
        _set_path(tree, parts, value)


def apply_overrides(tree: dict[str, Any], overrides: Mapping[str, Any], origins: Origins) -> None:
    """Applies dotted-key overrides (``{"catalog.uri": ...}``) or whole sections, with native values."""
    for key, value in overrides.items():
        _record_leaves(key, value, f"override {key!r}", origins)
        _set_path(tree, key.split("."), value)


def _set_path(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    leaf = parts[-1]
    if isinstance(value, Mapping) and isinstance(node.get(leaf), dict):
        for k, v in value.items():
            _set_path(node[leaf], [str(k)], v)
    else:
        node[leaf] = dict(value) if isinstance(value, Mapping) else value


def _record_leaves(key: str, value: Any, origin: str, origins: Origins) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _record_leaves(f"{key}.{k}", v, origin, origins)
    else:
        origins.record(key, origin)
