"""File table functions (``read_parquet``, ``read_csv``, ``read_json``) read by SQE, never by DuckDB.

DuckDB's own external access stays off. SQE checks every path, expands globs itself (listing with the same key
it reads with), re-checks every expanded file, and hands DuckDB an Arrow stream over a ``pyarrow.dataset``.

Where a file table function may read (the static ``[storage]`` pair is the only key it ever uses):
- object-store paths only under ``[storage.tvf] allowed_object_store_prefixes`` or a catalog's
  ``tvf_prefixes`` (path-segment boundaries; ``s3a://``/``s3n://`` count as ``s3://``); empty: nowhere;
- local paths only under ``[storage.tvf] allowed_local_prefixes`` (symlinks resolved); empty: none;
- never inside a governed Iceberg table's location (:class:`GovernedLocations`; a ``file://`` one against local
  paths, both as real paths): a prefix that overlaps one is refused, so the engine key (or the process's own
  file access) cannot become a way around read-restrictions or vended scoping.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from os.path import commonpath
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson

from sqe._text import first_line
from sqe.credentials import covered_by_any, is_local, is_object_store, normalize_location, prefix_matches
from sqe.errors import ExternalAccessError, QueryError, SQEError
from sqe.execution.object_store import filesystem_for, object_path, static_set
from sqe.locations import scheme_of
from sqe.planning.external_sql import arrow_type

# pyarrow.dataset (a tenth of a second to import) is loaded by the functions that build datasets: a session
# creates its file-function policy at start-up, but most statements never read a file (start-up cost).
if TYPE_CHECKING:
    import pyarrow.dataset as ds

    from sqe.catalog.base import TableIdent, TableProvider
    from sqe.config import SQEConfig
    from sqe.credentials import CredentialSet

OBJECT_STORE_SETTING = "[storage.tvf] allowed_object_store_prefixes (or a catalog's tvf_prefixes)"
LOCAL_SETTING = "[storage.tvf] allowed_local_prefixes"
_GLOB_CHARS = re.compile(r"[*?\[]")
# Table properties that move data or metadata outside the table location (they are governed locations too).
_LOCATION_PROPERTIES = ("write.data.path", "write.metadata.path", "write.object-storage.path")


# ----------------------------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class TvfPolicy:
    """The prefixes file table functions may read under; built once per session from the config."""

    object_store: tuple[str, ...]
    local: tuple[str, ...]

    @classmethod
    def from_config(cls, config: SQEConfig | None) -> TvfPolicy:
        if config is None:
            return cls((), ())
        prefixes = (*config.storage.tvf.allowed_object_store_prefixes, *config.catalog.tvf_prefixes)
        return cls(tuple(normalize_location(p) for p in prefixes), config.storage.tvf.allowed_local_prefixes)

    def check_pattern(self, function: str, pattern: str) -> None:
        """Refuse a path or glob before anything is listed or read."""
        _refuse_dot_segments(function, pattern)
        if is_object_store(pattern):
            self._check_object_store_pattern(function, pattern)
        elif is_local(pattern):  # named as written: a file:// pattern's authority may hold a password
            self._check_local(function, pattern, _strip_glob(_local_path(pattern)))
        else:
            raise ExternalAccessError(
                f"{function}: scheme {scheme_of(pattern)!r} of {pattern} is not supported (s3:// or a local path)"
            )

    def check_file(self, function: str, path: str) -> None:
        """Every expanded file, again: under an allowed prefix on a segment boundary."""
        _refuse_dot_segments(function, path)
        if is_object_store(path):
            if not covered_by_any(path, self.object_store):
                raise ExternalAccessError(f"{function}: {path} is outside {OBJECT_STORE_SETTING}")
        else:
            self._check_local(function, path, path)  # the file itself: a name may hold glob characters

    def _check_object_store_pattern(self, function: str, pattern: str) -> None:
        if not self.object_store:
            raise ExternalAccessError(
                f"{function}: file table functions may not read object storage: set {OBJECT_STORE_SETTING}"
            )
        fixed = fixed_part(pattern)
        if fixed != normalize_location(pattern) and not covered_by_any(fixed, self.object_store):
            raise ExternalAccessError(
                f"{function}: the glob {pattern} is not confined to an allowed prefix (its fixed part {fixed} "
                f"is outside {OBJECT_STORE_SETTING})"
            )
        if not covered_by_any(fixed, self.object_store):
            raise ExternalAccessError(f"{function}: {pattern} is outside {OBJECT_STORE_SETTING}")

    def _check_local(self, function: str, path: str, resolved: str) -> None:
        """``path`` (as named) must be under an allowed prefix once ``resolved`` (the part of it whose symlinks
        are followed: a pattern's fixed part, or an expanded file whole) is a real path."""
        if not self.local:
            raise ExternalAccessError(
                f"{function}: local files may not be read: {path} is not under {LOCAL_SETTING} (empty: none)"
            )
        real = os.path.realpath(resolved)
        if not any(_under(real, os.path.realpath(p)) for p in self.local):
            raise ExternalAccessError(f"{function}: local path {path} is not under {LOCAL_SETTING}")


def _refuse_dot_segments(function: str, path: str) -> None:
    rest = normalize_location(path).partition("://")[2] if "://" in path else path
    segments = rest.split("/")
    if any(s in (".", "..") for s in segments):
        raise ExternalAccessError(f"{function}: '.' and '..' path segments are not allowed in {path}")


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/") or "/"
    return path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/")


def _local_path(location: str) -> str:
    return location[len("file://") :] if location.lower().startswith("file://") else location


def _strip_glob(path: str) -> str:
    match = _GLOB_CHARS.search(path)
    return path if match is None else path[: path.rfind("/", 0, match.start()) + 1] or "/"


def fixed_part(pattern: str) -> str:
    """The directory part before the first glob character (the whole path when there is none)."""
    normalized = normalize_location(pattern)
    match = _GLOB_CHARS.search(normalized)
    if match is None:
        return normalized
    return normalized[: normalized.rfind("/", 0, match.start()) + 1]


# ------------------------------------------------------------------------------------------------- globs


class Glob:
    """A compiled glob with DuckDB's rules: the pattern and the path are split at ``/``; a segment that is exactly
    ``**`` matches any number of whole segments (one or more when it is the last), and any other segment matches
    exactly one path segment, where ``*`` (``**`` and ``***`` too) is any run of characters, ``?`` any one and
    ``[...]`` one of a class (:func:`_char_class`).

    ``match`` is one ``re`` match of a translation that cannot backtrack more than polynomially: ``re`` on a
    naive translation took exponential time on ``**?**?…**Z`` in one call holding the GIL, freezing every
    session of ``sqe serve``. Between stars everything has a fixed length (characters in a segment, segments
    between ``**``), so placing each such piece at its leftmost fit and the last one at the end finds a match
    whenever there is one; an atomic group ``(?>…)`` commits to that leftmost fit, so ``re`` never tries another
    (time at most path length times pattern length per piece)."""

    def __init__(self, regex: str) -> None:
        self._match = re.compile(regex, re.DOTALL).fullmatch

    def match(self, path: str) -> bool:
        return self._match(path) is not None


_ANY_SEGMENTS = r"(?:[^/]*+/)*"  # whole segments, each with its '/' (possessive: no backtracking inside one)


def compile_glob(pattern: str) -> Glob:
    """The pattern as a :class:`Glob` (DuckDB's rules). A segment with a ``[`` that no ``]`` closes matches
    nothing (:func:`_expand_one` then reads the pattern as a plain path, as DuckDB does)."""
    runs: list[list[str]] = [[]]  # the segments' regexes, in runs between `**` segments
    for segment in pattern.split("/"):
        if segment == "**":
            if runs[-1] or len(runs) == 1:  # `**/**` is `**`
                runs.append([])
        else:
            runs[-1].append(_segment_regex(segment))
    if len(runs) == 1:  # no `**`
        return Glob("/".join(runs[0]))
    first, *middle, last = runs
    regex = "".join(s + "/" for s in first)
    for run in middle:
        regex += "(?>" + _ANY_SEGMENTS + "?" + "".join(s + "/" for s in run) + ")"  # the leftmost fit, committed
    if last:
        return Glob(regex + _ANY_SEGMENTS + "/".join(last))
    return Glob(regex + ".+")  # a trailing `**`: at least one segment (a file)


def _segment_regex(segment: str) -> str:
    """One segment of a glob as a regex matching exactly one path segment: ``A*B*C`` is
    ``A(?>[^/]*?B)[^/]*C``, each piece at its leftmost fit and the last at the segment's end."""
    pieces: list[list[str]] = [[]]
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            if pieces[-1] or len(pieces) == 1:  # runs of stars are one star
                pieces.append([])
        elif char == "?":
            pieces[-1].append("[^/]")
        elif char == "[":
            parsed = _char_class(segment, i + 1)
            if parsed is None:
                return "(?!)"
            item, i = parsed
            pieces[-1].append(item)
        else:
            pieces[-1].append(re.escape(char))
        i += 1
    if len(pieces) == 1:
        return "".join(pieces[0])
    first, *middle, last = ("".join(piece) for piece in pieces)
    return first + "".join(f"(?>[^/]*?{piece})" for piece in middle) + "[^/]*" + last


def _char_class(segment: str, start: int) -> tuple[str, int] | None:
    """The class opened just before ``start`` as a regex, and the index of its ``]``; None when no ``]`` closes
    it. DuckDB's rules: a leading ``!`` negates (``^`` is itself), a ``]`` first is itself, ``x-y`` is a range
    unless the ``-`` is last, a downward range like ``z-a`` matches nothing, and a backslash is itself."""
    negated = segment[start : start + 1] == "!"
    first = j = start + negated
    ranges: list[tuple[str, str]] = []
    while j < len(segment):
        char = segment[j]
        if char == "]" and j > first:
            return _class_regex(ranges, negated), j
        if segment[j + 1 : j + 2] == "-" and j + 2 < len(segment) and segment[j + 2] != "]":
            ranges.append((char, segment[j + 2]))
            j += 3
        else:
            ranges.append((char, char))
            j += 1
    return None


def _class_regex(ranges: list[tuple[str, str]], negated: bool) -> str:
    kept = [(low, high) for low, high in ranges if low <= high]
    body = "".join(re.escape(low) if low == high else f"{re.escape(low)}-{re.escape(high)}" for low, high in kept)
    if negated:
        return f"[^{body}/]"
    if not kept:
        return "(?!)"
    return f"(?!/)[{body}]"  # a range such as !-a holds '/', which never belongs to a segment


# ---------------------------------------------------------------------------------------- governed tables


@dataclass
class GovernedLocations:
    """The locations of every table of the configured catalogs the user can list (re-read per query)."""

    provider: TableProvider
    warehouses: tuple[str, ...]
    locations: dict[str, str] = field(default_factory=dict)  # location -> table name
    local_paths: dict[str, str] = field(default_factory=dict)  # real path of a file:// location -> table name

    def refresh(self) -> None:
        found: dict[str, str] = {}
        local: dict[str, str] = {}
        for warehouse in self.warehouses:
            for ident in self._list(warehouse):
                for location in self._locations_of(ident):
                    found[normalize_location(location)] = str(ident)
                    local.update(dict.fromkeys(governed_local_paths(location), str(ident)))
        self.locations = found
        self.local_paths = local

    def check_prefixes(self, prefixes: Iterable[str]) -> None:
        for prefix in prefixes:
            for location, table in self.locations.items():
                if prefix_matches(location, prefix) or prefix_matches(prefix, location):
                    _refuse_overlap(prefix, location, table)

    def check_local_prefixes(self, prefixes: Iterable[str]) -> None:
        """Local prefixes (or a local pattern's fixed part) against file:// table locations, both as real paths:
        ``/x/y``, ``file:///x/y`` and a symlink to either name the same files."""
        for prefix in prefixes:
            real = os.path.realpath(prefix)
            for path, table in self.local_paths.items():
                if _under(path, real) or _under(real, path):
                    _refuse_overlap(prefix, path, table)

    def check_file(self, function: str, path: str) -> None:
        if is_object_store(path):
            inside = next((t for loc, t in self.locations.items() if prefix_matches(path, loc)), None)
        else:
            real = os.path.realpath(_local_path(path))
            inside = next((t for loc, t in self.local_paths.items() if _under(real, loc)), None)
        if inside is not None:
            raise ExternalAccessError(f"{function}: {path} is inside the location of Iceberg table {inside}")

    def _list(self, warehouse: str) -> list[TableIdent]:
        """The tables of every namespace at any depth: a nested namespace's table is governed data too."""
        try:
            return [t for ns in self._namespaces(warehouse) for t in self.provider.list_tables(warehouse, ns)]
        except SQEError as exc:
            raise ExternalAccessError(
                f"cannot check file table function prefixes against the tables of {warehouse}: {first_line(exc)}"
            ) from None

    def _namespaces(self, warehouse: str) -> list[tuple[str, ...]]:
        """Every namespace, walked level by level (in the catalog's order) until one has no children; each is
        visited once, so a catalog that names a namespace twice, or as its own child, cannot loop the walk."""
        found: dict[tuple[str, ...], None] = {}  # insertion-ordered set
        pending = deque(self.provider.list_namespaces(warehouse, None))
        while pending:
            namespace = tuple(pending.popleft())
            if not namespace or namespace in found:
                continue
            found[namespace] = None
            pending.extend(self.provider.list_namespaces(warehouse, namespace))
        return list(found)

    def _locations_of(self, ident: TableIdent) -> list[str]:
        try:
            loaded = self.provider.load_table(ident)
        except SQEError as exc:  # unknown location: the prefix cannot be proven disjoint from it
            raise ExternalAccessError(
                f"cannot check file table function prefixes against the location of {ident}: {first_line(exc)}"
            ) from None
        metadata = loaded.table.metadata
        properties = metadata.properties
        extra = [properties[k] for k in _LOCATION_PROPERTIES if properties.get(k)]
        return [metadata.location, *extra]


def _refuse_overlap(prefix: str, location: str, table: str) -> NoReturn:
    raise ExternalAccessError(
        f"file table function prefix {prefix} overlaps the location {location} of Iceberg table {table}; file "
        "table functions must not read governed table data"
    )


def governed_local_paths(location: str) -> set[str]:
    """The real local paths a table location names (none for object storage or another scheme): ``file:///x``,
    ``file:/x``, ``file://localhost/x`` and a bare path alike, percent-escaped or not (a local FileIO may read
    either spelling, so both are protected).

    A ``file:`` location ``urlsplit`` cannot parse (``file://[abc/x``, ``file://host]/x``: the catalog's answer is
    untrusted input) is an :class:`ExternalAccessError`. That fails closed: the local files such a location names
    are unknown, so no local prefix can be shown disjoint from them, and :meth:`GovernedLocations.refresh` refuses
    file table functions until the location is fixed, as it does for a table it cannot load; guessing a path
    instead could leave the files another reader takes it to name unprotected."""
    if location.lower().startswith("file:"):
        try:
            path = urlsplit(location).path
        except ValueError as exc:
            raise ExternalAccessError(
                f"cannot check file table function prefixes against the table location {location}: {exc}"
            ) from None
    elif scheme_of(location) == "":
        path = location
    else:
        return set()
    return {os.path.realpath(p) for p in (path, unquote(path)) if p}


# --------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class FileSource:
    """Resolved, checked files of one call, and how to read them. Holds a file system with a key: no pickling."""

    function: str
    file_format: str
    files: tuple[str, ...]  # pyarrow paths (bucket/key, or local absolute paths)
    locations: tuple[str, ...]  # the same, as written for users (s3://bucket/key)
    filesystem: pafs.FileSystem = field(repr=False)
    options: Mapping[str, Any] = field(default_factory=dict)
    base: str = ""  # pyarrow path of the fixed part, for hive partition keys
    partition_schema: pa.Schema | None = None  # explicit hive partition columns (external tables)
    filter: ds.Expression | None = None  # partition pruning
    schema: pa.Schema | None = None  # explicit data columns (external tables)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a file source holds storage credentials and cannot be pickled")


def _never_cancelled() -> None:
    return None


def expand(
    function: str,
    patterns: Sequence[str],
    filesystem: pafs.FileSystem,
    check: Callable[[str], None],
    cancel_check: Callable[[], None] = _never_cancelled,
) -> tuple[list[str], list[str]]:
    """Every file the patterns name, as (pyarrow paths, locations); ``check`` runs on every location, and
    ``cancel_check`` (raises once the statement is cancelled) between files."""
    files: list[str] = []
    locations: list[str] = []
    seen: set[str] = set()  # a list's `in` made a large listing quadratic
    for pattern in patterns:
        found = _expand_one(pattern, filesystem, cancel_check)
        if not found:
            raise QueryError(f"{function}: no file matches {pattern}")
        for location in found:
            cancel_check()
            check(location)
            if location not in seen:
                seen.add(location)
                locations.append(location)
                files.append(object_path(location) if is_object_store(location) else location)
    return files, locations


def _expand_one(pattern: str, filesystem: pafs.FileSystem, cancel_check: Callable[[], None]) -> list[str]:
    normalized = normalize_location(pattern)
    object_store = is_object_store(normalized)
    scheme = "s3://" if object_store else ""
    path = object_path(normalized) if object_store else _local_path(normalized)
    if _GLOB_CHARS.search(path) is None:
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [scheme + path]
        if info.type == pafs.FileType.Directory:  # a directory reads every file below it
            return _listing(filesystem, path.rstrip("/"), None, scheme, cancel_check)
        return []
    found = _listing(filesystem, _strip_glob(path).rstrip("/"), compile_glob(path), scheme, cancel_check)
    if not found and filesystem.get_file_info(path).type == pafs.FileType.File:
        return [scheme + path]  # as DuckDB: a glob that matches nothing may name a file, e.g. `[x]` or `a[b`
    return found


def _listing(
    filesystem: pafs.FileSystem,
    base: str,
    glob: Glob | None,
    scheme: str,
    cancel_check: Callable[[], None] = _never_cancelled,
) -> list[str]:
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as exc:
        raise QueryError(f"listing {scheme}{base} failed: {first_line(exc)}") from None
    found: list[str] = []
    for info in infos:
        cancel_check()
        if info.type == pafs.FileType.File and not _hidden(info.path) and (glob is None or glob.match(info.path)):
            found.append(scheme + info.path)
    return sorted(found)


def _hidden(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.startswith(("_", "."))


_COMMON_OPTIONS = {"hive_partitioning", "union_by_name", "filename"}
_FORMAT_OPTIONS = {
    "parquet": {"binary_as_string"},
    "csv": {"delim", "sep", "header", "quote", "escape", "skip", "nullstr", "columns", "auto_detect", "all_varchar"},
    "json": {"format", "columns", "records", "auto_detect"},
}


def resolve_call(
    function: str,
    file_format: str,
    patterns: Sequence[str],
    options: Mapping[str, Any],
    policy: TvfPolicy,
    governed: GovernedLocations,
    config: SQEConfig | None,
    cancel_check: Callable[[], None] = _never_cancelled,
) -> FileSource:
    """Check, expand and re-check one call's paths; the file system signs with the ``[storage]`` pair only."""
    unknown = set(options) - _COMMON_OPTIONS - _FORMAT_OPTIONS[file_format]
    if unknown:
        raise QueryError(f"{function}: option {sorted(unknown)[0]!r} is not supported by SQE's file table functions")
    for pattern in patterns:
        policy.check_pattern(function, pattern)
    governed.check_prefixes(fixed_part(p) for p in patterns if is_object_store(p))
    governed.check_local_prefixes(_strip_glob(_local_path(p)) for p in patterns if not is_object_store(p))
    kinds = {is_object_store(p) for p in patterns}
    if len(kinds) != 1:
        raise QueryError(f"{function}: object-store and local paths cannot be mixed in one call")
    filesystem: pafs.FileSystem
    if kinds == {True}:
        if config is None:
            raise ExternalAccessError(f"{function}: object storage needs an SQE config with a [storage] key pair")
        filesystem = filesystem_for(static_set(config, "file table functions"))
    else:
        filesystem = pafs.LocalFileSystem()

    def check(location: str) -> None:
        policy.check_file(function, location)
        governed.check_file(function, location)

    files, locations = expand(function, patterns, filesystem, check, cancel_check)
    base = _common_base(patterns)
    return FileSource(function, file_format, tuple(files), tuple(locations), filesystem, dict(options), base)


def _common_base(patterns: Sequence[str]) -> str:
    fixed = [fixed_part(p) for p in patterns]
    paths = [object_path(f) if is_object_store(f) else _local_path(f) for f in fixed]
    common = commonpath(paths)
    return common[: common.rfind("/") + 1] if "/" in common else common


def source_for_mount(
    name: str,
    file_format: str,
    location: str,
    credentials: CredentialSet,
    data_schema: pa.Schema,
    partition_schema: pa.Schema | None,
    filter_: ds.Expression | None,
    options: Mapping[str, Any],
) -> FileSource:
    """An external table's files: every file below its location, listed with the mount's own key set."""
    filesystem = filesystem_for(credentials)
    root = object_path(location).rstrip("/")
    files = _listing(filesystem, root, None, "s3://")
    return FileSource(
        name,
        file_format,
        tuple(object_path(f) for f in files),
        tuple(files),
        filesystem,
        dict(options),
        root + "/",
        partition_schema,
        filter_,
        data_schema,
    )


def build_dataset(source: FileSource) -> ds.Dataset:
    """The ``pyarrow.dataset`` over the source's files, with DuckDB's options translated."""
    import pyarrow.dataset as ds

    options = source.options
    file_format = _file_format(source)
    partitioning = _partitioning(source)
    schema = source.schema
    if schema is not None and source.partition_schema is not None:
        schema = pa.schema([*schema, *source.partition_schema])
    try:
        if schema is None and options.get("union_by_name") and len(source.files) > 1:
            schema = _unified_schema(source, file_format, partitioning)
        return ds.dataset(
            list(source.files),
            schema=schema,
            format=file_format,
            filesystem=source.filesystem,
            partitioning=partitioning,
            partition_base_dir=source.base if partitioning is not None else None,
        )
    except (OSError, pa.ArrowException) as exc:
        raise QueryError(f"{source.function}: cannot read {source.locations[0]}: {first_line(exc)}") from None


def _unified_schema(source: FileSource, file_format: ds.FileFormat, partitioning: Any) -> pa.Schema:
    import pyarrow.dataset as ds

    schemas = []
    for path in source.files:
        single = ds.dataset(
            [path],
            format=file_format,
            filesystem=source.filesystem,
            partitioning=partitioning,
            partition_base_dir=source.base if partitioning is not None else None,
        )
        schemas.append(single.schema)
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except pa.ArrowException as exc:  # a column whose types cannot be promoted to one (int64 and string)
        raise QueryError(
            f"{source.function}: union_by_name cannot combine the files' columns: {first_line(exc)}"
        ) from None


def _partitioning(source: FileSource) -> Any:
    import pyarrow.dataset as ds

    if source.partition_schema is not None:
        return ds.partitioning(source.partition_schema, flavor="hive")
    hive = source.options.get("hive_partitioning")
    if hive is None:  # DuckDB's default: on when the paths look like key=value directories
        hive = any("=" in f[len(source.base) :].rpartition("/")[0] for f in source.files)
    return ds.HivePartitioning.discover(infer_dictionary=False) if hive else None


def _file_format(source: FileSource) -> ds.FileFormat:
    import pyarrow.dataset as ds

    options = source.options
    if source.file_format == "parquet":
        return ds.ParquetFileFormat()
    if source.file_format == "csv":
        return _csv_format(source.function, options)
    if str(options.get("format", "auto")).lower() not in ("auto", "newline_delimited", "nd"):
        raise QueryError(f"{source.function}: only newline-delimited JSON is supported (format='newline_delimited')")
    columns = _explicit_columns(source.function, options.get("columns")) or source.schema
    parse = pajson.ParseOptions(explicit_schema=columns) if columns is not None else None
    return ds.JsonFileFormat(parse_options=parse)


def _csv_format(function: str, options: Mapping[str, Any]) -> ds.CsvFileFormat:
    import pyarrow.dataset as ds

    header = options.get("header", True)
    columns = _explicit_columns(function, options.get("columns"))
    skip = _skip_rows(function, options.get("skip", 0))
    read = pacsv.ReadOptions(
        skip_rows=skip,
        autogenerate_column_names=not header and columns is None,
        column_names=list(columns.names) if columns is not None else None,
    )
    if columns is not None and header:
        read = pacsv.ReadOptions(skip_rows=skip + 1, column_names=list(columns.names))
    delimiter = _one_character(
        function, "delim" if "delim" in options else "sep", options.get("delim", options.get("sep", ","))
    )
    quote = _one_character(function, "quote", options.get("quote", '"'), optional=True)
    escape = _one_character(function, "escape", options.get("escape"), optional=True)
    parse = pacsv.ParseOptions(
        delimiter=delimiter,
        quote_char=quote or False,
        escape_char=escape if escape and escape != quote else False,
        double_quote=not escape or escape == quote,
    )
    null_values = _null_strings(function, options.get("nullstr"))
    convert = pacsv.ConvertOptions(
        column_types=dict(zip(columns.names, columns.types, strict=True)) if columns is not None else None,
        null_values=null_values,
        strings_can_be_null=null_values is not None,
    )
    if options.get("all_varchar"):
        convert = pacsv.ConvertOptions(auto_dict_encode=False, column_types=None, null_values=null_values)
    return ds.CsvFileFormat(parse_options=parse, read_options=read, convert_options=convert)


_MAX_SKIP = 2**31 - 1  # pyarrow counts skipped rows in an int32


def _skip_rows(function: str, value: Any) -> int:
    """``skip``: a whole number of rows, 0 to 2^31-1, given as a number or as digits."""
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
    if not text.isdecimal() or int(text) > _MAX_SKIP:
        raise QueryError(f"{function}: option skip takes a whole number of rows from 0 to {_MAX_SKIP}")
    return int(text)


def _one_character(function: str, option: str, value: Any, *, optional: bool = False) -> str:
    """``delim``/``sep`` (one character), ``quote`` and ``escape`` (one character, or empty for none)."""
    text = "" if value is None or value is False else str(value)
    if len(text) == 1 or (optional and not text):
        return text
    allowed = "one character, or '' for none" if optional else "one character"
    raise QueryError(f"{function}: option {option} takes {allowed}")


def _null_strings(function: str, value: Any) -> list[str] | None:
    """``nullstr``: a string, or a list of strings, read as NULL."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value) or None
    raise QueryError(f"{function}: option nullstr takes a string or a list of strings")


def _explicit_columns(function: str, columns: Any) -> pa.Schema | None:
    if columns is None:
        return None
    if not isinstance(columns, dict) or not all(isinstance(v, str) for v in columns.values()):
        raise QueryError(f"{function}: columns takes a struct of name: 'TYPE' pairs")
    return pa.schema([(str(name), arrow_type(type_text)) for name, type_text in columns.items()])


class FileStream:
    """What DuckDB scans for one file table function call or external table: a fresh reader per call."""

    def __init__(self, source: FileSource) -> None:
        self.source = source
        self.dataset = build_dataset(source)
        self._with_filename = bool(source.options.get("filename"))
        if self._with_filename and "filename" in self.dataset.schema.names:
            raise QueryError(f"{source.function}: option filename adds a column filename, and the files have one")
        try:
            self.fragments = [f.path for f in self.dataset.get_fragments(filter=source.filter)]
            self.schema: pa.Schema = self._renamed(self._scanner().projected_schema)
        except (OSError, pa.ArrowException) as exc:
            raise QueryError(f"{source.function}: cannot read {source.locations[0]}: {first_line(exc)}") from None
        self.opened = 0

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        self.opened += 1
        scanner = self._scanner()
        reader = pa.RecordBatchReader.from_batches(self.schema, self._batches(scanner))
        return reader.__arrow_c_stream__(requested_schema)

    def _scanner(self) -> ds.Scanner:
        # pyarrow projects its per-file ``__filename`` by name only (an expression that names it finds no field)
        columns = [*self.dataset.schema.names, *(["__filename"] if self._with_filename else [])]
        return self.dataset.scanner(columns=columns, filter=self.source.filter)

    def _renamed(self, schema: pa.Schema) -> pa.Schema:
        """``__filename`` (the last column when asked for) as ``filename``."""
        if not self._with_filename:
            return schema
        return schema.set(len(schema) - 1, pa.field("filename", pa.string()))

    def _batches(self, scanner: ds.Scanner) -> Iterator[pa.RecordBatch]:
        try:
            for batch in scanner.to_batches():
                if self._with_filename:
                    batch = _with_locations(pa.RecordBatch.from_arrays(batch.columns, schema=self.schema), self.source)
                yield batch
        except (OSError, pa.ArrowException) as exc:
            raise QueryError(f"{self.source.function}: reading failed: {first_line(exc)}") from None

    def describe(self) -> dict[str, Any]:
        """An EXPLAIN row: files listed and scanned after partition pruning, the key's source. Never a secret."""
        return {
            "table": self.source.function,
            "files_listed": len(self.source.files),
            "files_scanned": len(self.fragments),
            "partition_filter": str(self.source.filter) if self.source.filter is not None else "",
            "credential_source": "static" if isinstance(self.source.filesystem, pafs.S3FileSystem) else "local",
        }

    def __reduce__(self) -> NoReturn:
        raise TypeError("a file stream holds storage credentials and cannot be pickled")

    def __repr__(self) -> str:
        return f"FileStream({self.source.function}, files={len(self.fragments)})"


def _with_locations(batch: pa.RecordBatch, source: FileSource) -> pa.RecordBatch:
    """pyarrow's ``__filename`` is ``bucket/key``; users wrote ``s3://bucket/key``."""
    if not isinstance(source.filesystem, pafs.S3FileSystem):
        return batch
    index = batch.schema.get_field_index("filename")
    names = pa.array(["s3://" + n for n in batch.column(index).to_pylist()], pa.string())
    return batch.set_column(index, "filename", names)
