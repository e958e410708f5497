"""The one check of the credential sets a ticket or a credential push carries (sqe.distributed.protocol)."""

from __future__ import annotations

import time

import pytest

from sqe.credentials import CredentialSet
from sqe.distributed.protocol.credential_sets import credential_sets_problem
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.ticket import check_complete

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEXAMPLE-session-token"
LATER_MS = int((time.time() + 86400) * 1000)


def cred(prefix: str = "s3://b/t", **changes: object) -> CredentialSet:
    values: dict[str, object] = {
        "prefix": prefix,
        "access_key_id": "ASIAEXAMPLE",
        "secret_access_key": SECRET,
        "session_token": TOKEN,
        "expires_at_ms": LATER_MS,
    }
    values.update(changes)
    return CredentialSet(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("push", [False, True])
def test_a_duplicate_prefix_is_refused_for_tickets_and_pushes_alike(push: bool) -> None:
    # s3a:// and a trailing slash name the same prefix: which set would win is arbitrary.
    problem = credential_sets_problem([cred("s3://b/x"), cred("s3a://b/x/")], push=push)
    assert problem.startswith("two credential sets for the prefix s3a://b/x/")
    assert problem.endswith("; keeping the current keys") == push
    assert credential_sets_problem([cred("s3://b/x"), cred("s3://b/y")], push=push) == ""


def test_the_ticket_codec_raises_the_shared_problem_with_its_context() -> None:
    sets = [cred("s3://b/x"), cred("s3://b/x")]
    with pytest.raises(InvalidTicketError) as raised:
        check_complete(sets, "rewrite ticket")
    assert str(raised.value) == f"rewrite ticket: {credential_sets_problem(sets)}"


def test_a_push_also_needs_vended_unexpired_sets_a_ticket_may_carry_others() -> None:
    static = cred(source="static", session_token=None, expires_at_ms=None)
    expired = cred(expires_at_ms=1000)
    assert credential_sets_problem([static]) == "" and credential_sets_problem([expired]) == ""
    assert "not a vended set" in credential_sets_problem([static], push=True)
    assert "has already expired" in credential_sets_problem([expired], push=True)
    assert credential_sets_problem([cred(expires_at_ms=2000)], push=True, now=1.0) == ""  # ``now`` is honoured


@pytest.mark.parametrize("push", [False, True])
def test_incomplete_sets_name_the_parts_the_one_rule_reports_and_no_secret(push: bool) -> None:
    problem = credential_sets_problem([cred(session_token=None, expires_at_ms=None)], push=push)
    assert "s3://b/t is incomplete (missing session token, expiry)" in problem
    assert SECRET not in problem and TOKEN not in problem and "ASIAEXAMPLE" not in problem


def test_a_pushed_prefix_is_shown_on_one_line_and_bounded() -> None:
    forged = credential_sets_problem([cred("s3://b/t\nforged: accepted", session_token=None)], push=True)
    assert "\n" not in forged and forged.startswith("the set for 's3://b/t\\nforged: accepted' is incomplete")
    long_prefix = "s3://b/" + "k" * 500
    shown = credential_sets_problem([cred(long_prefix, session_token=None)], push=True)
    assert long_prefix not in shown and "kkk'..." in shown and len(shown) < 300
