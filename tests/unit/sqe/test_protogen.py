"""The source checkout's generated gRPC/protobuf modules: regenerated when their generator is newer than the runtime.

A refreshed editable install compiles them in pip's isolated build environment, whose grpcio-tools can be newer
than the grpcio this environment keeps; the generated stubs then refuse to import (a worker exits at start-up).
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from sqe._protogen import WORKER, ProtoSet


@dataclass(frozen=True)
class _ProtoSetIn(ProtoSet):
    """The worker contract's ProtoSet, generating into a directory of the test's own."""

    root: Path = Path()

    @property
    def package_dir(self) -> Path:
        return self.root


def _worker_set(directory: Path) -> _ProtoSetIn:
    return _ProtoSetIn(WORKER.package, WORKER.sources, grpc=True, root=directory)


def _set_version(path: Path, pattern: str, replacement: str) -> None:
    text, count = re.subn(pattern, replacement, path.read_text(encoding="utf-8"), count=1, flags=re.MULTILINE)
    assert count == 1, f"no generator version in {path.name}"
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def generated(tmp_path: Path) -> _ProtoSetIn:
    proto_set = _worker_set(tmp_path)
    proto_set.generate()
    assert not proto_set.is_stale()
    return proto_set


def test_stubs_from_a_newer_grpc_generator_are_regenerated_with_this_environments(generated: _ProtoSetIn) -> None:
    stubs = generated.package_dir / "worker_pb2_grpc.py"
    _set_version(stubs, r"^GRPC_GENERATED_VERSION = '[^']+'$", "GRPC_GENERATED_VERSION = '999.0.0'")
    assert generated.is_stale()
    generated.ensure_generated()
    text = stubs.read_text(encoding="utf-8")
    assert "GRPC_GENERATED_VERSION = '999.0.0'" not in text
    assert f"GRPC_GENERATED_VERSION = '{importlib.metadata.version('grpcio-tools')}'" in text
    assert not generated.is_stale()


def test_messages_from_a_newer_protobuf_generator_are_stale(generated: _ProtoSetIn) -> None:
    messages = generated.package_dir / "worker_pb2.py"
    _set_version(messages, r"^# Protobuf Python Version: \S+$", "# Protobuf Python Version: 999.0.0")
    assert generated.is_stale()


def test_code_from_an_older_or_equal_generator_is_kept(generated: _ProtoSetIn) -> None:
    stubs = generated.package_dir / "worker_pb2_grpc.py"
    _set_version(stubs, r"^GRPC_GENERATED_VERSION = '[^']+'$", "GRPC_GENERATED_VERSION = '1.0.0'")
    before = stubs.stat().st_mtime_ns
    generated.ensure_generated()
    assert stubs.stat().st_mtime_ns == before and not generated.is_stale()
