"""Policy errors show an administrator's names, never a credential one of them quoted."""

from __future__ import annotations

from sqe_catalog.policies.errors import PolicyError, RegoError


def test_a_policy_error_quoting_a_url_keeps_its_password_out_of_every_form() -> None:
    error = RegoError("rego.parse", "unknown name 'https://admin:hunter22@db.example.com/x'", 7)
    for shown in (str(error), error.message, repr(error)):
        assert "hunter22" not in shown
        assert "db.example.com" in shown  # the rest of the text stays
    assert error.code == "rego.parse" and error.position == 7


def test_a_policy_error_without_a_credential_is_unchanged() -> None:
    error = PolicyError("tag.unknown", "tag 'pii' is not defined")
    assert str(error) == "[tag.unknown] tag 'pii' is not defined"
    assert error.message == "tag 'pii' is not defined"
