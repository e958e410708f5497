"""StoragePolicy: built from the engine config in one place; SQE's settings win; the static pair only in static mode."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from sqe.config import SQEConfig, load_config
from sqe.credentials import CredentialSet, StoragePolicy, StorageSettings

SECRET = "policy-secret-77c"


def _config(**overrides: Any) -> SQEConfig:
    base = {"catalog.uri": "http://127.0.0.1:8181", "catalog.warehouse": "demo"}
    return load_config(env={}, overrides={**base, **overrides})


STATIC = {"storage.access_key_id": "AKIASTATIC", "storage.secret_access_key": SECRET}


def test_from_config_carries_settings_and_limits() -> None:
    policy = StoragePolicy.from_config(
        _config(
            **{
                "storage.endpoint": "http://store:9",
                "storage.path_style": True,
                "catalog.credential_max_age_seconds": 60,
            }
        )
    )
    assert (policy.endpoint, policy.region, policy.path_style, policy.max_age_seconds) == (
        "http://store:9",
        None,
        True,
        60.0,
    )
    assert policy.static is None and not policy.require_vended


def test_local_settings_win_and_region_is_always_set() -> None:
    policy = StoragePolicy.from_config(_config(**{"storage.endpoint": "http://mine:1"}))
    merged = policy.local_settings(StorageSettings("http://catalog:1", "eu-west-1", False, "5"))
    assert merged == StorageSettings("http://mine:1", "eu-west-1", False, "5")
    assert policy.local_settings(StorageSettings()).region == policy.default_region


def test_static_pair_only_in_static_mode_but_always_recognised() -> None:
    static = StoragePolicy.from_config(_config(**STATIC))
    assert static.static is not None and static.static.source == "static" and static.static.prefix == "s3://"
    required = StoragePolicy.from_config(_config(**STATIC, **{"catalog.require_vended_credentials": True}))
    assert required.static is None and required.require_vended
    vended_back = CredentialSet("s3://b", "AKIASTATIC", SECRET)
    assert static.is_static_pair(vended_back) and required.is_static_pair(vended_back)
    assert not required.is_static_pair(CredentialSet("s3://b", "AKIASTATIC", "other-secret"))


def test_worker_policy_uses_only_given_sets() -> None:
    worker = StoragePolicy.for_worker()
    assert worker.require_vended and worker.static is None and worker.static_pair_digest is None
    assert worker.endpoint is None and worker.region is None


def test_no_secret_in_repr_and_no_pickling() -> None:
    policy = StoragePolicy.from_config(_config(**STATIC))
    assert SECRET not in repr(policy) and "AKIASTATIC" not in repr(policy)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(policy)
