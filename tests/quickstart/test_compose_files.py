"""The Docker quickstarts, checked offline (no Docker engine on these machines): compose files against the
Compose Specification schema, the Dockerfile's structure, and the mounted configs against their generator."""

from __future__ import annotations

import importlib.resources
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from dockerfile_parse import DockerfileParser

import sqe.config
from sqe.server.config import load_server_config
from sqe_catalog.config import load_config as load_catalog_config
from sqe_stack.ceph import _ceph_conf
from sqe_stack.quickstart import generated_files, polaris_catalog_request
from workers.cli import _parser
from workers.server import ServerOptions

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "quickstart" / "compose"
SCENARIOS = ("rustack", "polaris-rustack", "ceph")
RUN_SCENARIO = COMPOSE / "run-scenario.sh"  # the steps every scenario's run.sh runs, given its folder name
INSTRUCTIONS = {"FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "EXPOSE", "CMD", "ENTRYPOINT", "LABEL"}


def _compose_schema() -> dict[str, Any]:
    path = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


def _validator() -> Any:
    schema = _compose_schema()
    return jsonschema.validators.validator_for(schema)(schema)  # the draft the schema declares (2020-12)


def _compose(scenario: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((COMPOSE / scenario / "docker-compose.yml").read_text())
    return doc


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_compose_file_is_valid_against_the_compose_spec(scenario: str) -> None:
    doc = _compose(scenario)
    validator = _validator()
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []


def test_the_schema_check_catches_a_broken_compose_file() -> None:
    broken = _compose("rustack")
    broken["services"]["sqe-catalog"]["depends_on"] = {"sqe-init": {"condition": "when_it_feels_like_it"}}
    broken["services"]["sqe-catalog"]["portz"] = ["8181"]
    assert len(list(_validator().iter_errors(broken))) >= 2


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_mounted_file_and_dependency_exists(scenario: str) -> None:
    doc = _compose(scenario)
    services = doc["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./") and not source.startswith("./.state"):
                assert (COMPOSE / scenario / source).is_file(), f"{name} mounts missing {source}"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        build = service.get("build")
        if build:
            assert (COMPOSE / scenario / build["context"] / build["dockerfile"]).resolve().is_file()
    for port_list in (s.get("ports", []) for s in services.values()):
        assert all(str(p).startswith("127.0.0.1:") for p in port_list)  # never published beyond loopback
    run = (COMPOSE / scenario / "run.sh").read_text()
    assert run.startswith("#!/usr/bin/env bash") and run.rstrip().endswith(f'/../run-scenario.sh" {scenario}')
    shared = RUN_SCENARIO.read_text()
    assert shared.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in shared and "trap" in shared
    known = re.search(r"^\s*([\w| -]+)\) ;;$", shared, re.MULTILINE)  # the case arm of accepted names
    assert known is not None and scenario in known.group(1).split(" | ")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_workers_pass_the_worker_clis_plaintext_rule(scenario: str) -> None:
    """Each worker listens off loopback (0.0.0.0 in its container), so it must be given a certificate and a token."""
    workers = {n: s for n, s in _compose(scenario)["services"].items() if s.get("command", [""])[0] == "sqe-worker"}
    assert set(workers) == {"sqe-worker-1", "sqe-worker-2"}
    for service in workers.values():
        args = _parser().parse_args(service["command"][1:])
        tls = (b"cert", b"key") if args.tls_cert and args.tls_key else (None, None)
        token = "t" * 32 if args.token_file else None  # off loopback a worker needs a token too
        ServerOptions(args.listen, token, tls_cert=tls[0], tls_key=tls[1])  # raises ConfigError on plaintext
        assert str(args.tls_cert) == "/var/lib/sqe/tls/worker.crt"
        run = RUN_SCENARIO.read_text()
        assert "subjectAltName=DNS:sqe-worker-1,DNS:sqe-worker-2" in run and "-out .state/tls/worker.crt" in run


def test_dockerfile_parses_and_copies_only_existing_paths() -> None:
    parser = DockerfileParser(path=str(COMPOSE / "Dockerfile"))
    structure = [i for i in parser.structure if i["instruction"] != "COMMENT"]
    instructions = [i["instruction"] for i in structure]
    assert instructions[0] == "FROM" and set(instructions) <= INSTRUCTIONS
    assert len(parser.parent_images) == 2  # build stage + runtime stage
    for item in structure:
        if item["instruction"] == "COPY" and "--from=" not in item["value"]:
            *sources, _dest = item["value"].split()
            assert all((ROOT / s).exists() for s in sources), item["value"]
    cmd = next(i["value"] for i in structure if i["instruction"] == "CMD")
    assert json.loads(cmd)[0] == "sqe"


def test_committed_configs_are_exactly_what_the_generator_writes() -> None:
    files = generated_files()
    for rel, text in files.items():
        assert (COMPOSE / rel).read_text(encoding="utf-8") == text, f"{rel} is stale: run `make quickstart-configs`"
    committed = {p.relative_to(COMPOSE).as_posix() for p in COMPOSE.glob("*/*") if p.suffix in (".toml", ".json")}
    assert committed == set(files)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_generated_configs_parse_with_the_real_loaders(scenario: str) -> None:
    folder = COMPOSE / scenario
    if (folder / "catalog.toml").exists():
        warehouse = load_catalog_config(folder / "catalog.toml").warehouses[0]
        assert warehouse.role_arn and not warehouse.sts_unavailable and warehouse.path_style
    engine = sqe.config.load_config(folder / "engine.toml", env={"SQE_COORDINATOR__TOKEN": "t" * 32})
    assert engine.catalog.require_vended_credentials and engine.static_key_pair() is None
    assert engine.coordinator.tls_ca == "/var/lib/sqe/tls/worker.crt"  # the workers are not on loopback
    assert load_server_config(folder / "server.toml", env={}).tls_cert


def test_polaris_storage_config_vends_through_rustack_sts() -> None:
    storage = json.loads((COMPOSE / "polaris-rustack" / "polaris-catalog.json").read_text())["catalog"]
    info = storage["storageConfigInfo"]
    assert info["roleArn"].startswith("arn:aws:iam::") and info["stsEndpoint"] == "http://rustack:4566"
    assert info["stsUnavailable"] is False and info["pathStyleAccess"] is True
    assert storage == polaris_catalog_request()["catalog"]


def test_ceph_setup_uses_the_sts_options_of_the_tested_ceph_stack() -> None:
    tested = _ceph_conf(Path("/x"), "fsid", 1, 2, "k" * 16)
    script = (COMPOSE / "ceph" / "rgw-setup.sh").read_text()
    for option, value in (
        ("rgw sts key", None),
        ("rgw s3 auth use sts", "true"),
        ("rgw sts min session duration", "5"),
    ):
        assert re.search(rf"^{option} = ", tested, re.M), option
        line = next(ln for ln in script.splitlines() if option.replace(" ", "_") in ln)
        assert value is None or line.rstrip().endswith(value)
