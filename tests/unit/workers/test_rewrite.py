"""The rewrite FileIO writes only the ticket's exact output paths, once each, and never deletes; rewrite tickets
with unsafe output paths are refused before anything runs; written-file statistics survive the wire."""

from __future__ import annotations

import threading

import pytest

from sqe.credentials import CredentialSet, StorageSettings
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.rewrite import _output_paths, decode_file_stats, encode_file_stats
from sqe.errors import WorkerError
from workers.rewrite import OutputNotAllowedError, RewriteFileIO

ALLOWED = "s3://bucket/t/data/compact-a-00000-1-000.parquet"


def rewrite_io() -> RewriteFileIO:
    cred = CredentialSet(
        prefix="s3://bucket/t", access_key_id="AKIDEXAMPLE", secret_access_key="s3cr3t", source="static"
    )
    return RewriteFileIO([cred], StorageSettings(endpoint="http://127.0.0.1:1"), [ALLOWED], cancel=threading.Event())


def test_only_the_named_output_path_may_be_opened_and_only_once() -> None:
    io = rewrite_io()
    with pytest.raises(OutputNotAllowedError, match=r"may not write s3://bucket/t/data/other\.parquet"):
        io.new_output("s3://bucket/t/data/other.parquet")
    with pytest.raises(OutputNotAllowedError):
        io.new_output("s3://bucket/t/metadata/v9.metadata.json")
    assert io.new_output(ALLOWED.replace("s3://", "s3a://")).location.endswith("000.parquet")
    with pytest.raises(OutputNotAllowedError):
        io.new_output(ALLOWED)  # a second write of the same path


def test_a_rewrite_never_deletes() -> None:
    with pytest.raises(WorkerError, match="rewrites never delete files"):
        rewrite_io().delete(ALLOWED)


def test_repr_names_no_key() -> None:
    assert "AKIDEXAMPLE" not in repr(rewrite_io()) and "s3cr3t" not in repr(rewrite_io())


@pytest.mark.parametrize(
    "paths",
    [[], ["relative/x.parquet"], ["s3://b/t/data/x.json"], ["s3://b/t/data/*.parquet"], [ALLOWED, ALLOWED]],
)
def test_unsafe_output_paths_are_refused(paths: list[str]) -> None:
    with pytest.raises(InvalidTicketError):
        _output_paths(paths)


def test_file_stats_round_trip() -> None:
    stats = {
        "column_sizes": {1: 10},
        "value_counts": {1: 3},
        "null_value_counts": {1: 0},
        "nan_value_counts": {},
        "lower_bounds": {1: b"\x01\x00"},
        "upper_bounds": {1: b"\xff"},
        "split_offsets": [4],
    }
    assert decode_file_stats(encode_file_stats(stats)) == stats
    with pytest.raises(InvalidTicketError):
        decode_file_stats(b'{"lower_bounds": {"1": "%%%"}}')
