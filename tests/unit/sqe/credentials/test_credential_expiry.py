"""The expiry rule: 5 minutes before expiry, half the lifetime left for short tokens, max age if unknown."""

from __future__ import annotations

import pytest

from sqe.credentials import usable_until

RECEIVED = 1_700_000_000.0


def _expiring_in(seconds: float) -> int:
    return round((RECEIVED + seconds) * 1000)


@pytest.mark.parametrize(
    ("lifetime", "expected_usable_for"),
    [
        (3600, 3300),  # long token: 5 minutes before expiry
        (900, 600),
        (600.001, 300.001),  # just at 10 minutes: the margin rule applies (and meets the half rule there)
        (600, 300),
        (599.998, 299.999),  # just under 10 minutes: half the remaining lifetime
        (120, 60),
        (2, 1),
        (0, 0),
    ],
)
def test_usable_until(lifetime: float, expected_usable_for: float) -> None:
    limit = usable_until(_expiring_in(lifetime), RECEIVED)
    assert limit == pytest.approx(RECEIVED + expected_usable_for, abs=1e-3)


def test_rule_uses_receive_time_not_now() -> None:
    # The same token received later has less left, so it is used for a shorter time.
    expires = _expiring_in(700)
    assert usable_until(expires, RECEIVED) == pytest.approx(RECEIVED + 400)
    assert usable_until(expires, RECEIVED + 200) == pytest.approx(RECEIVED + 200 + 250)


def test_expired_on_arrival_is_unusable_from_the_start() -> None:
    limit = usable_until(_expiring_in(-10), RECEIVED)
    assert limit is not None and limit < RECEIVED


def test_vended_without_expiry_lasts_max_age_not_forever() -> None:
    assert usable_until(None, RECEIVED) == RECEIVED + 900
    assert usable_until(None, RECEIVED, max_age_seconds=60) == RECEIVED + 60


@pytest.mark.parametrize("source", ["static", "none"])
def test_static_and_no_credentials_never_expire(source: str) -> None:
    assert usable_until(_expiring_in(10), RECEIVED, source=source) is None  # type: ignore[arg-type]
    assert usable_until(None, RECEIVED, source=source) is None  # type: ignore[arg-type]
