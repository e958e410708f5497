"""The ``sqe`` command as a subprocess (``-e``, output formats, errors, the interactive shell on stdin) against
moto + sqe-catalog, and the secrets check: no secret used in this module shows up anywhere it could leak.

CLI processes run with bogus ``AWS_*`` variables (moto rejects them), so every read goes through vended
credentials.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import pickle
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest

import sqe.api
from sqe.errors import SQEError
from sqe.session import Session
from sqe.vocabulary import S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN
from tests.conftest import BOGUS_AWS_ENV, pyiceberg_catalog, raw_load_table, write_sqe_config

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

SQE = Path(sys.executable).parent / "sqe"  # the installed console script
ROWS = [(1, "apple", 0.5), (2, "banana", 0.25), (3, "cherry", 3.0)]


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str


CLI_RUNS: list[Run] = []  # every CLI run of this module: the secrets test searches all of their output


@dataclass(frozen=True)
class Setup:
    server: CatalogServer
    principal: CatalogPrincipal
    config: Path
    namespace: str

    @property
    def table(self) -> str:
        return f"{self.namespace}.items"


@pytest.fixture(scope="module")
def setup(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Setup:
    principal = engine_writer
    namespace = f"cli_{uuid.uuid4().hex[:6]}"
    pyiceberg_catalog(catalog_server, principal).create_namespace(namespace)
    config = write_sqe_config(
        tmp_path_factory.mktemp("cli") / "sqe.toml", catalog_server.url, principal, catalog_server.moto
    )
    values = ", ".join(f"({i}, '{name}', {price})" for i, name, price in ROWS)
    with sqe.api.connect(config) as session:
        session.sql(
            f"CREATE TABLE {namespace}.items AS "
            f"SELECT id, name, price::DOUBLE AS price FROM (VALUES {values}) v(id, name, price)"
        )
    return Setup(catalog_server, principal, config, namespace)


def run_sqe(*args: str, stdin: str | None = None, home: Path | None = None) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQE_", "AWS_"))}
    env.update(BOGUS_AWS_ENV)
    if home is not None:
        env["SQE_HISTORY"] = str(home / "history")
    done = subprocess.run(
        [str(SQE), *args], input=stdin, capture_output=True, text=True, timeout=120, env=env, check=False
    )
    run = Run(tuple(args), done.returncode, done.stdout, done.stderr)
    CLI_RUNS.append(run)
    return run


def assert_one_line_error(run: Run) -> str:
    assert run.code != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    return lines[0]


def test_execute_prints_a_table(setup: Setup) -> None:
    run = run_sqe("--config", str(setup.config), "-e", f"SELECT id, name FROM {setup.table} ORDER BY id")
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].split() == ["|", "id", "|", "name", "|"]
    assert [line.split()[1::2] for line in lines[3:6]] == [["1", "apple"], ["2", "banana"], ["3", "cherry"]]
    assert lines[-1] == "(3 rows)" and run.stderr == ""


def test_csv_and_json_output_parse_back(setup: Setup) -> None:
    sql = f"SELECT id, name, price FROM {setup.table} ORDER BY id"
    as_csv = run_sqe("--config", str(setup.config), "-e", sql, "--format", "csv")
    assert as_csv.code == 0, as_csv.stderr
    records = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert records[0] == ["id", "name", "price"]
    assert [(int(i), n, float(p)) for i, n, p in records[1:]] == ROWS
    as_json = run_sqe("--config", str(setup.config), "-e", sql, "--format", "json")
    assert as_json.code == 0, as_json.stderr
    parsed = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert parsed == [{"id": i, "name": n, "price": p} for i, n, p in ROWS]


def test_parquet_output_is_a_readable_file(setup: Setup, tmp_path: Path) -> None:
    target = tmp_path / "out.parquet"
    sql = f"SELECT * FROM {setup.table} ORDER BY id"
    run = run_sqe("--config", str(setup.config), "-e", sql, "--format", "parquet", "--output", str(target))
    assert run.code == 0 and run.stdout == "", run.stderr
    table = pq.read_table(target)
    assert table.column_names == ["id", "name", "price"]
    assert [tuple(r.values()) for r in table.to_pylist()] == ROWS
    missing_output = run_sqe("--config", str(setup.config), "-e", sql, "--format", "parquet")
    assert missing_output.code != 0 and "--output" in assert_one_line_error(missing_output)


@pytest.mark.parametrize(
    "sql",
    ["SELECT * FROM {ns}.no_such_table", "SELEC 1", "CREATE INDEX i ON {ns}.items (id)", "SELECT nope FROM {ns}.items"],
    ids=["unknown-table", "syntax", "unsupported", "unknown-column"],
)
def test_a_bad_query_prints_one_error_line(setup: Setup, sql: str) -> None:
    run = run_sqe("--config", str(setup.config), "-e", sql.format(ns=setup.namespace))
    assert assert_one_line_error(run).startswith("sqe: error: ")
    assert run.stdout == ""


def test_bad_config_prints_one_error_line(setup: Setup, tmp_path: Path) -> None:
    missing = run_sqe("--config", str(tmp_path / "absent.toml"), "-e", "SELECT 1")
    assert assert_one_line_error(missing).startswith("sqe: error: config file not found")
    typo = tmp_path / "typo.toml"
    typo.write_text(setup.config.read_text() + "\n[catalgo]\nuri = 'http://x'\n")
    typo.chmod(0o600)  # it holds the secret too: readable by others it would be warned about first
    assert "catalgo" in assert_one_line_error(run_sqe("--config", str(typo), "-e", "SELECT 1"))


def test_debug_shows_details(setup: Setup) -> None:
    run = run_sqe("--config", str(setup.config), "--debug", "-e", f"SELECT * FROM {setup.namespace}.no_such_table")
    assert run.code != 0
    assert "Traceback (most recent call last)" in run.stderr and "NoSuchTableError" in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("sqe: error: ")
    assert "DEBUG:" in run.stderr  # debug logging is on as well


def test_stack_status_on_a_missing_dir_fails_cleanly(tmp_path: Path) -> None:
    run = run_sqe("stack", "status", "--dir", str(tmp_path / "nowhere"))
    line = assert_one_line_error(run)
    assert "no stack" in line and str(tmp_path / "nowhere") in line


def test_interactive_shell_on_stdin(setup: Setup, tmp_path: Path) -> None:
    script = "\n".join(
        [
            f"\\dt {setup.namespace}",
            f"\\d {setup.table}",
            "\\timing",
            "SELECT id,",
            "       upper(name) AS loud",
            f"FROM {setup.table}",
            "WHERE price < 1",
            "ORDER BY id;",
            "SELECT * FROM no_such_namespace.t;",
            f"SELECT count(*) AS n FROM {setup.table};",
            "\\q",
            f"SELECT 'never run' FROM {setup.table};",
        ]
    )
    run = run_sqe("--config", str(setup.config), stdin=script + "\n", home=tmp_path)
    assert run.code == 1, run.stderr  # a script with a failed statement
    out = run.stdout
    assert "| wh " in out and f"| {setup.namespace} " in out and "| items" in out  # \dt
    for column, kind in (("id", "int"), ("name", "string"), ("price", "double")):
        assert any(f"| {column}" in line and kind in line for line in out.splitlines()), out  # \d
    assert "| 1  | APPLE  |" in out and "| 2  | BANANA |" in out and "CHERRY" not in out  # multi-line statement
    assert "| 3 |" in out and "never run" not in out
    assert "Timing is on." in run.stderr and "Time: " in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in run.stderr  # the bad statement; the shell carried on
    assert (tmp_path / "history").exists()


# ------------------------------------------------------------------------------------------------- secrets


@pytest.fixture()
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


def test_no_secret_leaks_anywhere(setup: Setup, debug_logs: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    server = setup.server
    raw = raw_load_table(server, setup.principal, setup.namespace, "items")
    [vended] = raw["storage-credentials"]
    secrets = {*server.secrets, server.token(setup.principal), server.moto.secret_access_key}
    secrets |= {vended["config"][S3_SECRET_ACCESS_KEY], vended["config"][S3_SESSION_TOKEN]}
    texts: dict[str, str] = {}
    with sqe.api.connect(setup.config) as session:
        assert session.sql(f"SELECT count(*) FROM {setup.table} WHERE true").fetchall() == [(3,)]
        plan = session.last_streams[0].plan
        loaded = plan.loaded
        used = loaded.io.resolve(loaded.table.location()).properties  # type: ignore[attr-defined]
        # The keys SQE read with are the ones in the raw response, so searching for those means something.
        assert used[S3_ACCESS_KEY_ID] == vended["config"][S3_ACCESS_KEY_ID]
        assert used[S3_SECRET_ACCESS_KEY] == vended["config"][S3_SECRET_ACCESS_KEY]
        secrets.add(session._provider.catalog(server.warehouse)._bearer.current_token())  # type: ignore[attr-defined]
        texts["explain"] = str(session.sql(f"EXPLAIN SELECT * FROM {setup.table}").arrow().to_pylist())
        texts["errors"] = " ".join(error_messages(session, setup))
        texts["reprs"] = " ".join(
            repr(thing)
            for thing in (
                session,
                session.config,
                loaded,
                loaded.io,
                loaded.table,
                session._provider,  # type: ignore[attr-defined]
                session._provider.catalog(server.warehouse),  # type: ignore[attr-defined]
                plan,
                *loaded.io.pooled_file_ios(),  # type: ignore[attr-defined]
            )
        )
        texts["pickles"] = " ".join(pickle_failures(session, loaded.io, session.config, loaded))
    run_sqe("--config", str(setup.config), "--debug", "-e", f"SELECT * FROM {setup.table}")
    run_sqe("--config", str(setup.config), "-e", f"EXPLAIN SELECT * FROM {setup.table}")
    run_sqe("--config", str(setup.config), "--debug", "-e", f"INSERT INTO {setup.table} VALUES (NULL, NULL, 'x')")
    texts["caplog"] = debug_logs.text
    texts["catalog log"] = server.log_text()
    for run in CLI_RUNS:
        texts[f"sqe {' '.join(run.args)}"] = run.stdout + run.stderr
    assert len(secrets) >= 6 and all(len(s) >= 16 for s in secrets)
    assert "'property': 'credential_source', 'value': 'vended'" in texts["explain"] and "DEBUG" in texts["caplog"]
    assert setup.principal.name in texts["catalog log"]  # the log is there, and at debug level
    assert any("Traceback" in text for where, text in texts.items() if "--debug" in where)
    leaks = [(where, secret[:4] + "...") for where, text in texts.items() for secret in secrets if secret in text]
    assert leaks == []


def error_messages(session: Session, setup: Setup) -> list[str]:
    messages = []
    for sql in (
        f"SELECT * FROM {setup.namespace}.no_such_table",
        f"SELECT nope FROM {setup.table}",
        f"INSERT INTO {setup.table} VALUES (NULL, NULL, 'not a number')",
    ):
        with pytest.raises(SQEError) as caught:
            session.sql(sql).arrow()
        messages.append(str(caught.value))
    return messages


def pickle_failures(*objects: Any) -> list[str]:
    messages = []
    for thing in objects:
        with pytest.raises((TypeError, pickle.PicklingError, AttributeError)) as caught:
            pickle.dumps(thing)
        messages.append(str(caught.value))
    return messages
