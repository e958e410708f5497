"""ETag derivation and If-None-Match matching (pure functions)."""

from __future__ import annotations

import itertools

from sqe_catalog.etag import if_none_match_matches, table_etag

LOCATION = "s3://warehouse/wh/db/t/metadata/00001-a.metadata.json"


def test_etag_is_a_quoted_strong_tag_and_stable() -> None:
    tag = table_etag(LOCATION, snapshots="all", vended=False, write=False)
    assert tag.startswith('"') and tag.endswith('"') and not tag.startswith("W/")
    assert tag == table_etag(LOCATION, snapshots="all", vended=False, write=False)


def test_every_representation_dimension_changes_the_etag() -> None:
    tags = {
        table_etag(location, snapshots=mode, vended=vended, write=write, restrictions_digest=digest)
        for location, mode, vended, write, digest in itertools.product(
            [LOCATION, LOCATION.replace("00001", "00002")], ["all", "refs"], [False, True], [False, True], ["", "r1"]
        )
    }
    assert len(tags) == 32


def test_if_none_match() -> None:
    tag = table_etag(LOCATION, snapshots="all", vended=False, write=False)
    assert if_none_match_matches(tag, tag)
    assert if_none_match_matches(f'"other", {tag}', tag)
    assert if_none_match_matches(f"W/{tag}", tag)
    assert if_none_match_matches("*", tag)
    assert not if_none_match_matches(None, tag)
    assert not if_none_match_matches("", tag)
    assert not if_none_match_matches('"other"', tag)
    assert not if_none_match_matches(tag.strip('"'), tag)
