"""Scheme normalisation and prefix matching on path-segment boundaries."""

from __future__ import annotations

import pytest

from sqe.credentials import is_local, is_object_store, normalize_location, prefix_matches
from sqe.credentials.paths import prefix_length


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("s3a://b/t/x.parquet", "s3://b/t/x.parquet"),
        ("s3n://b/t", "s3://b/t"),
        ("S3A://b/T", "s3://b/T"),  # scheme case folds, bucket and key case do not
        ("s3://b/t", "s3://b/t"),
        ("file:///tmp/wh", "file:///tmp/wh"),
        ("/tmp/wh", "/tmp/wh"),
        ("gs://b/t", "gs://b/t"),
    ],
)
def test_normalize_location(location: str, expected: str) -> None:
    assert normalize_location(location) == expected


@pytest.mark.parametrize(
    ("path", "prefix", "expected"),
    [
        ("s3://b/t1", "s3://b/t1", True),
        ("s3://b/t1/data/x.parquet", "s3://b/t1", True),
        ("s3://b/t10/data/x.parquet", "s3://b/t1", False),  # raw startswith would say True
        ("s3://b/t10", "s3://b/t1", False),
        ("s3://b/t1-old/x", "s3://b/t1", False),
        ("s3://b/t1/x", "s3://b/t1/", True),
        ("s3://b/t1", "s3://b/t1/", True),
        ("s3://b/t10/x", "s3://b/t1/", False),
        ("s3://b/t1/x", "s3://b/t1//", True),
        ("s3://b/t1/x", "s3://b", True),
        ("s3://bb/t1/x", "s3://b", False),
        ("s3://b/t1/x", "s3://b/", True),
        ("s3://b/t1/x", "s3://", True),  # a scheme-wide prefix still works
        ("s3a://b/t1/x", "s3://b/t1", True),
        ("s3://b/t1/x", "s3n://b/t1", True),
        ("s3a://b/t10/x", "s3n://b/t1", False),
        ("s3://b/t1/x", "gs://b/t1", False),
        ("s3://other/t1/x", "s3://b/t1", False),
        ("s3://b/T1/x", "s3://b/t1", False),  # keys are case-sensitive
        ("file:///tmp/t1/x", "file:///tmp/t1", True),
        ("file:///tmp/t10/x", "file:///tmp/t1", False),
        ("s3://b/t1/x", "", False),
    ],
)
def test_prefix_matches_on_segment_boundaries(path: str, prefix: str, expected: bool) -> None:
    assert prefix_matches(path, prefix) is expected


def test_prefix_length_ignores_scheme_spelling_and_trailing_slashes() -> None:
    assert prefix_length("s3a://b/t1/") == prefix_length("s3://b/t1") < prefix_length("s3://b/t1/data")


@pytest.mark.parametrize(
    ("location", "object_store", "local"),
    [
        ("s3://b/k", True, False),
        ("s3a://b/k", True, False),
        ("S3N://b/k", True, False),
        ("file:///tmp/x", False, True),
        ("/tmp/x", False, True),
        ("gs://b/k", False, False),
        ("abfss://c@a.dfs.core.windows.net/k", False, False),
    ],
)
def test_location_kinds(location: str, object_store: bool, local: bool) -> None:
    assert (is_object_store(location), is_local(location)) == (object_store, local)


@pytest.mark.parametrize("path", ["s3://b/t1/../t10/x", "s3://b/t1/./x", "s3://b/t1/..", "s3a://b/t1/x/../../t2"])
def test_no_prefix_covers_a_path_with_dot_segments(path: str) -> None:
    # The AWS SDK resolves them before sending: the object read is not under the prefix the text starts with.
    assert not prefix_matches(path, "s3://b/t1")
    assert not prefix_matches(path, "s3://b")
