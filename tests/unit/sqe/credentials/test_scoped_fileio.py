"""ScopedFileIO: each file opens with its own credential set; nothing secret leaks out of it."""

from __future__ import annotations

import copy
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io import InputFile
from pyiceberg.table import Table

from sqe._text import iso_utc
from sqe.config import SQEConfig, load_config
from sqe.credentials import CatalogCredentials, ScopedFileIO, StoragePolicy, parse_catalog_credentials
from sqe.errors import CatalogProtocolError, CredentialError, CredentialExpiredError, NoVendedCredentialsError

STATIC_KEY, STATIC_SECRET = "AKIASTATIC", "static-secret-51f"
V1_SECRET, V1_TOKEN = "vended-secret-t1-0a1", "vended-token-t1-0a2"
V2_SECRET, V2_TOKEN = "vended-secret-t10-0b1", "vended-token-t10-0b2"
SECRETS = (STATIC_SECRET, V1_SECRET, V1_TOKEN, V2_SECRET, V2_TOKEN)
RECEIVED = float(int(time.time()))  # real time: an expired set never opens a file
T1_EXPIRES = RECEIVED + 3600
T10_EXPIRES = RECEIVED + 1800


def _config(**overrides: Any) -> SQEConfig:
    base = {
        "catalog.uri": "http://127.0.0.1:8181",
        "catalog.warehouse": "demo",
        "storage.endpoint": "http://127.0.0.1:1",
    }
    return load_config(env={}, overrides={**base, **overrides})


def _static_config(**overrides: Any) -> SQEConfig:
    return _config(**{"storage.access_key_id": STATIC_KEY, "storage.secret_access_key": STATIC_SECRET, **overrides})


def _entry(prefix: str, key: str, secret: str, token: str, expires: float | None) -> dict[str, Any]:
    config = {"s3.access-key-id": key, "s3.secret-access-key": secret, "s3.session-token": token}
    if expires is not None:
        config["s3.session-token-expires-at-ms"] = str(int(expires * 1000))
    return {"prefix": prefix, "config": config}


def _two_tables(root: str = "s3://b") -> list[dict[str, Any]]:
    return [
        _entry(f"{root}/t1", "V1", V1_SECRET, V1_TOKEN, T1_EXPIRES),
        _entry(f"{root}/t10/", "V2", V2_SECRET, V2_TOKEN, T10_EXPIRES),
    ]


def _scoped(config: dict[str, str], entries: list[dict[str, Any]], sqe: SQEConfig, **options: Any) -> ScopedFileIO:
    """A ScopedFileIO from a response with this config and these storage-credentials (parsed once, there)."""
    response = {"config": config, "storage-credentials": entries}
    return ScopedFileIO.from_response(response, StoragePolicy.from_config(sqe), **options)


def _signing_options(file: InputFile) -> dict[str, Any]:
    """What the pyarrow S3 filesystem behind ``file`` would sign with (read without any network call)."""
    options: dict[str, Any] = file._filesystem.__reduce__()[1][0]  # type: ignore[attr-defined]
    return options


class TestRouting:
    def test_each_s3_file_gets_its_own_credentials(self) -> None:
        io = _scoped({}, _two_tables(), _static_config(), received_at=RECEIVED)
        t1 = _signing_options(io.new_input("s3://b/t1/data/a.parquet"))
        t10 = _signing_options(io.new_output("s3a://b/t10/data/b.parquet"))  # type: ignore[arg-type]
        other = _signing_options(io.new_input("s3://b/t100/data/c.parquet"))
        assert (t1["access_key"], t1["secret_key"], t1["session_token"]) == ("V1", V1_SECRET, V1_TOKEN)
        assert (t10["access_key"], t10["secret_key"], t10["session_token"]) == ("V2", V2_SECRET, V2_TOKEN)
        assert (other["access_key"], other["secret_key"], other["session_token"]) == (
            STATIC_KEY,
            STATIC_SECRET,
            "",
        )
        for options in (t1, t10, other):
            assert options["endpoint_override"] == "http://127.0.0.1:1" and options["region"] == "us-east-1"

    def test_one_filesystem_per_credential_set(self) -> None:
        io = _scoped({}, _two_tables(), _config(), received_at=RECEIVED)
        a, b = io.new_input("s3://b/t1/a.parquet"), io.new_input("s3://b/t1/deep/b.parquet")
        c = io.new_input("s3://b/t10/c.parquet")
        assert a._filesystem is b._filesystem  # type: ignore[attr-defined]
        assert a._filesystem is not c._filesystem  # type: ignore[attr-defined]

    def test_real_reads_and_writes_route_by_prefix(self, tmp_path: Path) -> None:
        root = tmp_path.as_uri()
        io = _scoped({}, _two_tables(root), _config(), received_at=RECEIVED)
        (tmp_path / "t1").mkdir()
        (tmp_path / "t10").mkdir()
        paths = {f"{root}/t1/a.bin": b"first table", f"{root}/t10/b.bin": b"second table"}
        for path, payload in paths.items():
            with io.new_output(path).create() as out:
                out.write(payload)
        for path, payload in paths.items():
            with io.new_input(path).open() as fin:
                assert fin.read() == payload
        assert io.resolve(f"{root}/t1/a.bin").properties["s3.access-key-id"] == "V1"
        assert io.resolve(f"{root}/t10/b.bin").properties["s3.access-key-id"] == "V2"
        fs_t1 = io.new_input(f"{root}/t1/a.bin")._filesystem  # type: ignore[attr-defined]
        assert fs_t1 is not io.new_input(f"{root}/t10/b.bin")._filesystem  # type: ignore[attr-defined]
        io.delete(io.new_input(f"{root}/t1/a.bin"))
        io.delete(f"{root}/t10/b.bin")
        assert not (tmp_path / "t1" / "a.bin").exists() and not (tmp_path / "t10" / "b.bin").exists()

    def test_concurrent_resolution_builds_one_fileio_per_set(self) -> None:
        io = _scoped({}, _two_tables(), _config(), received_at=RECEIVED)
        paths = [f"s3://b/t{1 if i % 2 else 10}/f{i}.parquet" for i in range(32)]
        with ThreadPoolExecutor(8) as pool:
            keys = list(pool.map(lambda p: _signing_options(io.new_input(p))["access_key"], paths))
        assert keys == ["V1" if i % 2 else "V2" for i in range(32)]
        assert len(io.pooled_file_ios()) == 2

    def test_unsupported_scheme_fails_closed(self) -> None:
        io = _scoped({}, _two_tables(), _static_config(), received_at=RECEIVED)
        with pytest.raises(CredentialError, match="unsupported storage scheme 'gs'"):
            io.new_input("gs://b/t1/x.parquet")


class TestTableIntegration:
    def test_table_properties_cannot_choose_fileio_or_endpoint(self, tmp_path: Path) -> None:
        catalog = SqlCatalog("local", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=tmp_path.as_uri())
        catalog.create_namespace("ns")
        source = catalog.create_table("ns.t1", schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
        source.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}))
        source = catalog.load_table("ns.t1")
        hostile = {
            "py-io-impl": "sqe_no_such_module.Probe",
            "s3.endpoint": "http://attacker.invalid",
            "s3.retry-strategy-impl": "sqe_no_such_module.Retry",
            "s3.proxy-uri": "http://attacker.invalid",
        }
        metadata = source.metadata.model_copy(update={"properties": {**source.metadata.properties, **hostile}})
        creds = [_entry(source.location(), "V1", V1_SECRET, V1_TOKEN, T1_EXPIRES)]
        io = _scoped({}, creds, _config(), received_at=RECEIVED, location=source.location())
        table = Table(("ns", "t1"), metadata, source.metadata_location, io=io, catalog=catalog)
        assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
        assert len(io.pooled_file_ios()) == 1  # the data was read through SQE's per-credential FileIO
        data_file = next(iter(table.scan().plan_files())).file.file_path
        assert dict(io.resolve(data_file).properties) == {
            "s3.endpoint": "http://127.0.0.1:1",
            "s3.region": "us-east-1",
            "s3.access-key-id": "V1",
            "s3.secret-access-key": V1_SECRET,
            "s3.session-token": V1_TOKEN,
        }
        assert table.io.properties == {}  # nothing secret (or otherwise) reachable through pyiceberg's view


class TestFailClosed:
    def test_require_vended_fails_at_construction_for_an_uncovered_table(self) -> None:
        config = _static_config(**{"catalog.require_vended_credentials": True})
        with pytest.raises(NoVendedCredentialsError, match="s3://b/t2"):
            _scoped({}, _two_tables(), config, location="s3://b/t2")
        io = _scoped({}, _two_tables(), config, location="s3://b/t1")
        with pytest.raises(NoVendedCredentialsError):
            io.new_input("s3://b/elsewhere/x.parquet")

    def test_require_vended_always_passes_explicit_vended_keys(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAAMBIENT")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ambient-secret")
        config = _static_config(**{"catalog.require_vended_credentials": True})
        options = _signing_options(_scoped({}, _two_tables(), config).new_input("s3://b/t1/x"))
        assert (options["access_key"], options["anonymous"]) == ("V1", False)

    def test_static_mode_without_keys_leaves_the_sdk_chain(self) -> None:
        options = _signing_options(_scoped({}, [], _config()).new_input("s3://b/t1/x"))
        assert not options["access_key"] and not options["secret_key"]  # documented: AWS SDK default chain

    def test_from_response_parses_and_validates(self) -> None:
        response = {
            "metadata-location": "s3://b/t1/metadata/v1.json",
            "config": {"s3.region": "eu-west-1"},
            "storage-credentials": [_entry("s3://b/t1", "V1", V1_SECRET, V1_TOKEN, None)],
        }
        io = ScopedFileIO.from_response(response, StoragePolicy.from_config(_config()), received_at=RECEIVED)
        assert io.resolve("s3://b/t1/x").properties["s3.region"] == "eu-west-1"
        with pytest.raises(CatalogProtocolError, match="storage-credentials must be a list"):
            ScopedFileIO.from_response({"storage-credentials": {}}, StoragePolicy.from_config(_config()))
        bad_expiry = _entry("s3://b/t1", "V1", V1_SECRET, V1_TOKEN, None)
        bad_expiry["config"]["s3.session-token-expires-at-ms"] = "tomorrow"
        with pytest.raises(CatalogProtocolError, match="must be an integer"):
            ScopedFileIO.from_response({"storage-credentials": [bad_expiry]}, StoragePolicy.from_config(_config()))


class TestExpiryAndExplain:
    def test_earliest_expiry_and_usable_point(self) -> None:
        io = _scoped({}, _two_tables(), _config(), received_at=RECEIVED)
        assert io.source == "vended"
        assert io.expires_at == pytest.approx(T10_EXPIRES)
        assert io.usable_until == pytest.approx(T10_EXPIRES - 300)
        assert io.is_usable(T10_EXPIRES - 301) and not io.is_usable(T10_EXPIRES - 300)

    def test_vended_without_expiry_is_bounded_by_max_age(self) -> None:
        creds = [_entry("s3://b/t1", "V1", V1_SECRET, V1_TOKEN, None)]
        config = _config(**{"catalog.credential_max_age_seconds": 120})
        io = _scoped({}, creds, config, received_at=RECEIVED)
        assert io.expires_at is None and io.usable_until == RECEIVED + 120

    def test_static_and_none_never_expire(self) -> None:
        static = _scoped({}, [], _static_config(), received_at=RECEIVED)
        assert (static.source, static.expires_at, static.usable_until) == ("static", None, None)
        assert static.is_usable(RECEIVED + 10**9)
        assert _scoped({}, [], _config()).source == "none"
        required = _static_config(**{"catalog.require_vended_credentials": True})
        assert _scoped({}, [], required).source == "none"  # the static pair is not in use there

    def test_describe_lists_scopes_without_secrets(self) -> None:
        io = _scoped({}, _two_tables(), _static_config(), received_at=RECEIVED)
        rows = io.describe()
        assert rows == [
            {
                "prefix": "s3://b/t1",
                "source": "vended",
                "expires_at": iso_utc(T1_EXPIRES),
                "usable_until": iso_utc(T1_EXPIRES - 300),
            },
            {
                "prefix": "s3://b/t10/",
                "source": "vended",
                "expires_at": iso_utc(T10_EXPIRES),
                "usable_until": iso_utc(T10_EXPIRES - 300),
            },
            {"prefix": "*", "source": "static", "expires_at": None, "usable_until": None},
        ]

    def test_describe_marks_static_passthrough(self) -> None:
        creds = [_entry("s3://b/t1", STATIC_KEY, STATIC_SECRET, "tok", T1_EXPIRES)]
        rows = _scoped({}, creds, _static_config(), received_at=RECEIVED).describe()
        assert rows[0] == {
            "prefix": "s3://b/t1",
            "source": "static",
            "expires_at": None,
            "usable_until": None,
        }


class TestSecrets:
    def _io(self) -> ScopedFileIO:
        return _scoped(
            {"s3.access-key-id": "VC", "s3.secret-access-key": V2_SECRET},
            _two_tables(),
            _static_config(),
            received_at=RECEIVED,
        )

    def test_refuses_pickling(self) -> None:
        io = self._io()
        io.new_input("s3://b/t1/x")
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(io)

    def test_copies_share_the_same_object(self) -> None:
        io = self._io()
        assert copy.copy(io) is io and copy.deepcopy(io) is io

    def test_no_secret_in_repr_str_describe_or_properties(self) -> None:
        io = self._io()
        io.new_input("s3://b/t1/x")
        rendered = [
            repr(io),
            str(io),
            repr(io.describe()),
            repr(io.properties),
            repr(io.resolve("s3://b/t1/x")),
            repr(io.resolve("s3://b/zzz")),
        ]
        for text in rendered:
            for secret in SECRETS:
                assert secret not in text
        assert "source='vended'" in repr(io)


def test_identity_names_the_credential_set_and_holds_no_secret() -> None:
    """The key of the FileIO pool and the footer cache: one per vended set (prefix and every key), the same for
    every file under it."""
    io = _scoped({}, _two_tables(), _config())
    t1 = io.resolve("s3://b/t1/data/a.parquet").identity
    assert io.resolve("s3://b/t1/data/b.parquet").identity == t1
    assert io.resolve("s3://b/t10/data/a.parquet").identity != t1
    revended = [_entry("s3://b/t1", "V3", V1_SECRET, V1_TOKEN, T1_EXPIRES)]  # same prefix, new key
    assert _scoped({}, revended, _config()).resolve("s3://b/t1/data/a.parquet").identity != t1
    new_token = [_entry("s3://b/t1", "V1", V1_SECRET, V2_TOKEN, T1_EXPIRES)]  # same key id, another token
    assert _scoped({}, new_token, _config()).resolve("s3://b/t1/data/a.parquet").identity != t1
    assert not any(secret in t1 for secret in (*SECRETS, "V1"))


class TestDotSegments:
    """The AWS SDK resolves ``.``/``..`` before sending: ``s3://b/t1/../t10/x`` reads ``s3://b/t10/x``."""

    @pytest.mark.parametrize("path", ["s3://b/t1/../t10/x.parquet", "s3a://b/t1/./../t10/x", "s3://b/t1/.."])
    def test_a_dot_segment_path_never_gets_the_credentials_of_the_prefix_it_spells(self, path: str) -> None:
        io = _scoped({}, _two_tables(), _config(), location="s3://b/t1")
        with pytest.raises(CredentialError, match=r"'\.' or '\.\.' segment"):
            io.resolve(path)
        with pytest.raises(CredentialError):
            io.new_input(path)

    def test_require_vended_fails_closed_for_a_dot_segment_path(self) -> None:
        config = _static_config(**{"catalog.require_vended_credentials": True})
        io = _scoped({}, [_entry("s3://b/t1", "V1", V1_SECRET, V1_TOKEN, T1_EXPIRES)], config, location="s3://b/t1")
        with pytest.raises(CredentialError):
            io.new_input("s3://b/t1/../t2/x.parquet")  # t2 has no credentials: nothing may read it


class TestExpiredSetsNeverOpen:
    def test_a_set_past_its_expiry_opens_nothing_without_a_refresher(self) -> None:
        expires = time.time() + 1.0  # a real one-second credential
        io = _scoped({}, [_entry("s3://b/t1", "V1", V1_SECRET, V1_TOKEN, expires)], _config())
        io.new_input("s3://b/t1/x.parquet")  # still valid: opens
        time.sleep(max(0.0, expires - time.time()) + 0.1)
        with pytest.raises(CredentialExpiredError, match=r"s3://b/t1/x\.parquet .*expired at") as raised:
            io.new_input("s3://b/t1/x.parquet")
        assert not any(secret in str(raised.value) for secret in SECRETS)
        io.new_input("s3://b/other/x.parquet")  # a path the expired set does not cover is unaffected


class TestRefreshNeverSwitchesKeys:
    @pytest.mark.parametrize("static", [True, False])
    def test_paths_only_the_dropped_config_keys_covered_fail_after_a_refresh(self, static: bool) -> None:
        # Polaris-shaped: load-table sends its keys in config and in an entry for the location; the credentials
        # endpoint answers with the entry only. Files outside the location (a migrated table's) were read with
        # config's keys; after the refresh they fell to the [storage] pair (or the SDK's chain) silently.
        expired = RECEIVED - 60
        config = _entry("unused", "V0", "config-secret-0c1", "config-token-0c2", expired)["config"]
        loaded = [_entry("s3://b/t1", "V0", "config-secret-0c1", "config-token-0c2", expired)]
        answer = {"storage-credentials": [_entry("s3://b/t1", "V1", V1_SECRET, V1_TOKEN, T1_EXPIRES)]}
        refreshes: list[int] = []

        def refresh() -> CatalogCredentials:
            refreshes.append(1)
            return parse_catalog_credentials(answer, "credentials response")

        sqe = _static_config() if static else _config()
        io = _scoped(config, loaded, sqe, location="s3://b/t1", refresher=refresh)
        assert _signing_options(io.new_input("s3://b/t1/data/a.parquet"))["access_key"] == "V1"
        assert refreshes == [1]
        with pytest.raises(CredentialError, match="earlier credentials covered") as raised:
            io.new_input("s3://b/t2/data/b.parquet")
        assert not any(secret in str(raised.value) for secret in SECRETS)
        assert _signing_options(io.new_input("s3://b/t1/data/c.parquet"))["access_key"] == "V1"  # still read


class TestLocalPathsOfObjectStoreTables:
    """A manifest is the writer's text: one naming a local file must not make the engine (in ``sqe serve``, the
    server process) read its own files for a table that lives in object storage."""

    @pytest.mark.parametrize("require_vended", [True, False])
    def test_a_local_path_in_an_object_store_table_is_refused(self, tmp_path: Path, require_vended: bool) -> None:
        local = tmp_path / "server-secret.bin"
        local.write_bytes(b"server-local bytes")
        config = _config(**{"catalog.require_vended_credentials": require_vended})
        io = _scoped({}, _two_tables(), config, location="s3://b/t1")
        for path in (local.as_uri(), str(local)):
            with pytest.raises(CredentialError, match="local path"):
                io.new_input(path).open().read()

    def test_a_local_table_still_reads_its_local_files(self, tmp_path: Path) -> None:
        local = tmp_path / "t" / "data.bin"
        local.parent.mkdir()
        local.write_bytes(b"local table bytes")
        io = _scoped({}, [], _config(), location=(tmp_path / "t").as_uri())
        assert io.new_input(local.as_uri()).open().read() == b"local table bytes"


def test_files_it_opens_refuse_pickling() -> None:
    """Found by review: pyiceberg's file objects pickled with their pyarrow S3 filesystem, whose state holds the
    vended secret and session token; every other object holding a credential refuses (``Unpicklable``)."""
    io = _scoped({}, _two_tables(), _config(), received_at=RECEIVED)
    for file in (io.new_input("s3://b/t1/data/a.parquet"), io.new_output("s3://b/t10/data/b.parquet")):
        assert file.location.startswith("s3://b/t1")
        for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="holds credentials"):
                attempt(file)
        assert not any(secret in repr(file) for secret in SECRETS)
