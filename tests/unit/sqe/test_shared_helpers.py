"""The shared text and network helpers and counters."""

from __future__ import annotations

import base64
import json
import pickle
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote

import pytest

from sqe._counters import Counters
from sqe._net import is_loopback
from sqe._text import (
    MAX_MESSAGE_CHARS,
    counted,
    first_line,
    has_credential_shape,
    iso_utc,
    redact_credentials,
    redacted_message,
    without_secrets,
)
from sqe.errors import CatalogError, QueryError
from sqe_catalog.errors import CatalogError as CatalogServerError


def test_first_line_cuts_multiline_and_names_empty_exceptions() -> None:
    assert first_line(ValueError("  one\ntwo ")) == "one"
    assert first_line(ValueError()) == "ValueError"
    assert first_line("") == ""
    assert first_line("abcdef", limit=3) == "abc"
    # cut after the credentials are out: a cut inside a password leaves no '@' to show it is one
    assert first_line("see http://alice:" + "p" * 300 + "@h/x", limit=30) == "see http://alice:***@h/x"


def test_is_loopback_accepts_only_this_machine() -> None:
    assert all(is_loopback(host) for host in ("localhost", "127.0.0.1", "127.8.9.10", "::1"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "10.0.0.1", "::", "example.internal", ""))


def test_redact_credentials_keeps_the_location_and_drops_its_credentials() -> None:
    assert redact_credentials("read http://alice:pw@h:1/x.csv now") == "read http://alice:***@h:1/x.csv now"
    # an unescaped '@' or '/' in the password leaves no tail; quotes end the URL
    assert redact_credentials("'postgresql://u:p@s/s@db:5432/x'") == "'postgresql://u:***@db:5432/x'"
    presigned = "https://b.s3/k?X-Amz-Credential=AKIA1%2Fx&X-Amz-Date=1&X-Amz-Security-Token=T&X-Amz-Signature=S"
    assert redact_credentials(presigned) == (
        "https://b.s3/k?X-Amz-Credential=***&X-Amz-Date=1&X-Amz-Security-Token=***&X-Amz-Signature=***"
    )
    sas = '"https://a.blob/c?sv=2020&sig=abc%3D;token=t&key=k&AWSAccessKeyId=A&Signature=s#frag"'
    assert (
        redact_credentials(sas)
        == '"https://a.blob/c?sv=2020&sig=***;token=***&key=***&AWSAccessKeyId=***&Signature=***"'
    )
    # an authority quoted without its scheme (DuckDB's "file:// scheme only supports localhost authority, got: ...")
    assert redact_credentials("got: alice:pw@127.0.0.1:9") == "got: alice:***@127.0.0.1:9"
    # nothing to take out: a path's '@', a port, ordinary parameters, plain text
    for kept in (
        "s3://b/a@b/c",
        "http://h:8080/x?v=1&part=2",
        "WHERE key = 1 AND token > 2",
        "no url here",
        "bob@example.com",
    ):
        assert redact_credentials(kept) == kept


# Quadratic before: every scheme-like start scanned to the end of the text for an '@' (about ten minutes for one
# of these). A user controls such text: a huge SQL literal DuckDB echoes in its error.
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "unit",
    [
        "a.",
        "a://:",
        "a://",
        "(a:",
        "?a",
        "&a=",
        "@:/?=",
        "a:/@?=&",
        "#a=",
        " a",
        " token=",
        "authorization: ",
        "Authorization=Bearer ",
        "bearer ",
        "Bearer 1",
        "eyJa.",
        "eyJ",
        "eyJa.b",
        "'a': '",
        '"a":"',
        '"token": "\\',
        "'token':'",
        "a://u:'x",
        "password =",
        "passpass",
        " pwd = '",
        "<a>",
        "<token>x<",
        "a://u:p@h.c:1/a://u:",
        "a://u:1/@",
        "a://t1@",
        "a%3A%2F%2Fu%3A",
        "X-Token:X-Token:",
        "x-token=a,",
        "authorization:x'",
        "a%2Ba%3A%2F%2F",
        "%2Ba%3A%2F%2Fb",
        "a%3A%2F%2Fb%2B",
        "a=b?",
        "a=?token=",
        "%3Fa%3D",
        "%26token%3D%25",
        "%3Fa%2F",
        "a://u:''",
        "''a",
        "a://u:1?x=",
        "a://u:1?x=a@",
        "a://u:p@h/",
        "u:p@s/",
        '\\"token\\": \\"',
        '\\\\"token\\\\"',
        "secret: the ",
        "token: ",
        "f(password=x)",
        "mailto:a@",
        "!a:",
        "!a:@",
        "a:b/",
        "token = ",
        "x =  ",
        "password=a ",
        ";pwd=a b",
        "pw=a'",
        "secret: a'",
        "ExpiredToken: The x ",
        ";pwd=a b'",
        ";pwd=a ')",
        "pw=a')' ",
        "Bearer a=",
        "Authorization: a b ",
        "secretsmanager:",
        "(secret 'a",
        ",token \t",
    ],
)
def test_redact_credentials_takes_linear_time_on_adversarial_text(unit: str) -> None:
    text = "@ " + unit * (1_000_000 // len(unit)) + " x"
    assert redact_credentials(text).startswith("@ ")


# Found by review: the history filter's JWT shape tried every ``eyJ`` of a long base64url run to the run's end (about
# three minutes for the first of these); a statement pasted into the shell is such text.
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("unit", "end", "shaped"), [("x-eyJ", "", False), ("x-eyJ", ".p", True), ("-eyJa", " ", False)]
)
def test_has_credential_shape_takes_linear_time_on_adversarial_text(unit: str, end: str, shaped: bool) -> None:
    assert has_credential_shape(unit * (1_000_000 // len(unit)) + end) is shaped


def test_redact_credentials_keeps_ports_ipv6_hosts_and_windows_paths() -> None:
    for kept in (
        "http://[::1]:8181/x@y.csv",  # an IPv6 host is no user
        "cannot read http://127.0.0.1:9000/bucket/a.parquet",  # a port with no '@' after it
        r"IO Error: Cannot open file C:\Users\me\a@b.csv",  # a drive letter is no user
    ):
        assert redact_credentials(kept) == kept
    assert redact_credentials("http://u:pw@[::1]:8181/x") == "http://u:***@[::1]:8181/x"
    assert redact_credentials("http://u:1234@h/x") == "http://u:***@h/x"  # all digits, then '@': a password
    # a port then an '@' may be a password's digits (test_..._drops_a_password_starting_with_digits_then_a_slash...)
    assert redact_credentials("http://h:80/go?to=http://a:pw@x/y") == "http://h:***@x/y"


def test_redact_credentials_drops_a_password_of_a_url_json_escaped_or_percent_encoded() -> None:
    """JSON may write ``/`` as ``\\/`` (a catalog's config echoed in an error); a redirect's parameter carries a
    whole URL percent-encoded."""
    assert redact_credentials('{"uri": "http:\\/\\/user:pw@host\\/x"}') == '{"uri": "http:\\/\\/user:***@host\\/x"}'
    assert redact_credentials("go?next=https%3A%2F%2Fu%3Apw%40host%2Fx&a=1") == (
        "go?next=https%3A%2F%2Fu%3A***%40host%2Fx&a=1"
    )
    assert redact_credentials("https%3a%2f%2fu%3ap%40ss%40h") == "https%3a%2f%2fu%3a***%40h"
    assert redact_credentials("https%3A%2F%2Fh%3A443%2Fx") == "https%3A%2F%2Fh%3A443%2Fx"  # a port: no '%40'


def test_redact_credentials_drops_a_percent_encoded_password_after_a_compound_scheme() -> None:
    """Found by review: an encoded scheme had to start after a letter-less character, so ``mongodb%2Bsrv%3A`` and
    ``jdbc%3Amysql%3A`` (whose ``srv`` and ``mysql`` follow an escape's hex digit) showed their password."""
    assert redact_credentials("next=mongodb%2Bsrv%3A%2F%2Fu%3Apw9x%40db%2F&a=1") == (
        "next=mongodb%2Bsrv%3A%2F%2Fu%3A***%40db%2F&a=1"
    )
    assert redact_credentials("next=jdbc%3Amysql%3A%2F%2Fu%3Apw9x%40h.c%3A3306") == (
        "next=jdbc%3Amysql%3A%2F%2Fu%3A***%40h.c%3A3306"
    )


def test_redact_credentials_drops_a_credential_parameter_of_a_percent_encoded_url() -> None:
    """Found by review: a presigned URL percent-encoded whole (a redirect's ``?next=``) kept its signature."""
    assert redact_credentials(
        "go?next=https%3A%2F%2Fh%2Fp%3Fv%3D1%26X-Amz-Signature%3Dab%252Bc%26sig%3Ds1%23f&a=1"
    ) == ("go?next=https%3A%2F%2Fh%2Fp%3Fv%3D1%26X-Amz-Signature%3D***%26sig%3D***%23f&a=1")
    assert (
        redact_credentials("next=https%3a%2f%2fh%2fp%23access_token%3dt0k")
        == "next=https%3a%2f%2fh%2fp%23access_token%3d***"
    )
    for kept in ("next=https%3A%2F%2Fh%2Fp%3Fv%3D1%26region%3Deu", "discount%3D10%25"):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_a_percent_encoded_token_used_as_the_whole_userinfo() -> None:
    """Found by review: ``https://***@host`` was done for a plain or JSON-escaped URL, not a percent-encoded one."""
    assert redact_credentials("next=https%3A%2F%2Fghp_abc123%40git.example%2Fr") == (
        "next=https%3A%2F%2F***%40git.example%2Fr"
    )
    for kept in ("next=ssh%3A%2F%2Fgit%40github.com%2Fx", "https%3A%2F%2Fh.c%2Fa%40b", "abfss%3A%2F%2Fc1%40a.dfs%2Fx"):
        assert redact_credentials(kept) == kept
    # an '@' in the query or fragment is no userinfo's, as in a plain URL
    for kept in ("next=https%3A%2F%2Fh.c%3Femail%3Da1%40b.com", "next=https%3A%2F%2Fh.c%23a1%40b.com"):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_a_token_used_as_the_whole_userinfo() -> None:
    assert redact_credentials("clone https://ghp_abc123@host/repo failed") == "clone https://***@host/repo failed"
    assert redact_credentials("https://" + "a" * 40 + "@h/x") == "https://***@h/x"  # too long for a name
    for kept in ("ssh://git@github.com/x", "https://first.last@h/x", "abfss://c1@acct.dfs.core.windows.net/x"):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_an_all_digit_password_followed_by_a_slash() -> None:
    """``u:12345/`` reads as a port to a URL parser; with an ``@`` before the next ``/`` it goes as a password."""
    assert redact_credentials("https://u:12345/@host/x") == "https://u:***@host/x"
    assert redact_credentials("https://u:123/45@host") == "https://u:***@host"
    assert redact_credentials("http://127.0.0.1:9000/bucket/a@b.parquet") == "http://127.0.0.1:***@b.parquet"


def test_redact_credentials_hides_all_to_the_last_at_of_a_url() -> None:
    """A password may hold ``@``, ``/`` and ``:`` unescaped, so what follows an earlier ``@`` may be its rest: all to
    the last ``@`` goes, the host and path before it too (over-redaction, never a password's tail)."""
    assert redact_credentials("https://u:pw@h:443/a@b") == "https://u:***@b"
    assert redact_credentials("https://u:p@ss@db.local/a@b x") == "https://u:***@b x"
    assert redact_credentials("http://u:pw@[::1]/a@b") == "http://u:***@b"
    # the path may quote a URL of its own: all of it goes with the outer password
    assert redact_credentials("http://u:pw@h:80/go?to=http://a:pw2@x/y") == "http://u:***@x/y"
    assert redact_credentials("'postgresql://u:p@s/s@db:5432/x'") == "'postgresql://u:***@db:5432/x'"
    assert redact_credentials("http://u:pw@h/x") == "http://u:***@h/x"  # one '@': host and path stay


def test_redact_credentials_drops_a_passphrase() -> None:
    assert redact_credentials("'host=h sslpassphrase=s3cr3t'") == "'host=h sslpassphrase=***'"
    assert redact_credentials('{"key_passphrase": "pp"}') == '{"key_passphrase": "***"}'


def test_redact_credentials_drops_a_credential_header_in_free_text() -> None:
    assert redact_credentials("sent X-Amz-Security-Token: FQoGZXIvYXdz/x==") == "sent X-Amz-Security-Token: ***"
    assert redact_credentials("Host: h X-Amz-Security-Token: tok X-Amz-Date: 1") == "Host: h X-Amz-Security-Token: ***"
    assert redact_credentials("got a=b,x-amz-security-token=FQo x-api-key:k1") == (
        "got a=b,x-amz-security-token=*** x-api-key:***"
    )
    assert redact_credentials("x-api-key = 'k 1'\nnext") == "x-api-key = ***\nnext"
    assert redact_credentials("Authorization: ghp_abc123\nAccept: */*") == "Authorization: ***\nAccept: */*"
    assert redact_credentials("Proxy-Authorization: Basic dXNlcjpwYXNz") == "Proxy-Authorization: Basic ***"
    for kept in ("X-Amz-Date: 20260101", "Content-Type: text/plain", "authorization: principal lacks TABLE_READ"):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_an_authorization_header_value() -> None:
    assert redact_credentials("Authorization: Bearer eyJhbGci.e30.c2ln") == "Authorization: Bearer ***"
    assert redact_credentials("{'Authorization': 'Basic dXNlcjpwYXNz', 'Accept': '*/*'}") == (
        "{'Authorization': 'Basic ***', 'Accept': '*/*'}"
    )
    assert redact_credentials("[(b'authorization', b'Bearer tok-123')]") == "[(b'authorization', b'Bearer ***')]"
    assert redact_credentials('{"adbc.flight.sql.authorization_header": "bearer t0k"}') == (
        '{"adbc.flight.sql.authorization_header": "bearer ***"}'
    )
    # AWS's header: every part after the scheme (the credential and the signature) goes
    aws = "Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request, Signature=5d6"
    assert redact_credentials(aws) == "Authorization: AWS4-HMAC-SHA256 ***"
    for kept in (
        "unsupported authorization scheme 'Digest'; use Bearer or Basic",
        "authorization: principal lacks TABLE_READ_DATA on ns.t",
        "Authorization failed for bob@example.com",
    ):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_a_credential_in_a_url_fragment() -> None:
    assert redact_credentials("https://h/cb#access_token=T0K&state=s1") == "https://h/cb#access_token=***&state=s1"


def test_redact_credentials_drops_a_connection_string_credential() -> None:
    """``name=value`` starting a word or a quoted string, as connection strings write them (libpq, MySQL, Azure's
    AccountKey first), not only after a URL's ``?``, ``&`` or ``;``."""
    assert redact_credentials("string 'AccountKey=k3y==;AccountName=a' to INT32") == (
        "string 'AccountKey=***;AccountName=a' to INT32"
    )
    assert redact_credentials("'host=127.0.0.1 user=root passwd=pw password=pw2'") == (
        "'host=127.0.0.1 user=root passwd=*** password=***'"
    )
    assert redact_credentials("secret_access_key='s k'; region='eu'") == "secret_access_key=***; region='eu'"
    assert "T0K" not in redact_credentials("header Authorization=Bearer T0K")
    for kept in ("SELECT 1 AS key, 2 AS token", "WHERE key=1", "'key=value'", "region=eu-west-1 keys=3"):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_a_query_credential_of_a_url_a_word_parameter_holds() -> None:
    """Found by review: ``name=value`` starting a word took its whole value, so a URL in it kept its ``?sig=``,
    ``&password=`` or ``?token=`` (``location=s3://b/x?sig=...``), which were never looked at."""
    assert redact_credentials("read location=s3://b/x?sig=s1g&v=2") == "read location=s3://b/x?sig=***&v=2"
    assert redact_credentials('"url=https://h/x?a=1&password=pw9"') == '"url=https://h/x?a=1&password=***"'
    assert redact_credentials("--uri=https://h/x?token=t0k") == "--uri=https://h/x?token=***"
    assert redact_credentials("x='a ?api_key=k3y'") == "x='a ?api_key=***'"


def test_redact_credentials_drops_a_bearer_token_and_a_jwt_anywhere() -> None:
    """A catalog's ErrorModel message or a DuckDB error quoting a string may hold a token with no header name."""
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
    assert redact_credentials(f'{{"error": {{"message": "Invalid token Bearer {jwt}", "code": 401}}}}') == (
        '{"error": {"message": "Invalid token Bearer ***", "code": 401}}'
    )
    assert redact_credentials("Malformed Authorization header: bearer tok-123") == (
        "Malformed Authorization header: bearer ***"
    )
    assert redact_credentials(f"invalid bearer token '{jwt}' (expired)") == "invalid bearer token '***' (expired)"
    assert redact_credentials(f"principal from {jwt}.") == "principal from ***."
    assert redact_credentials("Bearer abcdefghijklmnopqrstuvwxyz") == "Bearer ***"  # long: a token, no word
    for kept in (
        "unsupported authorization scheme 'Digest'; use Bearer or Basic",
        "send a Bearer token in the Authorization header",
        "Bearer authentication failed.",
        "eyJ is no token",
    ):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_a_credential_member_of_json_or_a_dict_repr() -> None:
    """An OAuth answer, a catalog's config or a client's options quoted in an error as JSON or a dict's repr."""
    body = '{"access_token": "abc123", "expires_in": 3600, "client_secret":"s\\"x"}'
    assert redact_credentials(body) == '{"access_token": "***", "expires_in": 3600, "client_secret":"***"}'
    assert redact_credentials("input {'s3.secret-access-key': 'wJal/K7', 's3.region': 'eu'}") == (
        "input {'s3.secret-access-key': '***', 's3.region': 'eu'}"
    )
    # a header's scheme stays, as the Authorization rule leaves it
    assert redact_credentials("{'Authorization': 'Basic dXNlcjpwYXNz'}") == "{'Authorization': 'Basic ***'}"
    assert redact_credentials('{"password": "pa***ss"}') == '{"password": "***"}'  # only a header's scheme stays
    for kept in ('{"key": "k1", "type": "NotFound"}', "{'name': 'token', 'code': 404}"):
        assert redact_credentials(kept) == kept


def test_redact_credentials_reads_a_credential_key_name_in_any_case() -> None:
    """A lower-cased URL (a proxy's log, a case-folding message) names SigV2's AWSAccessKeyId all in one word."""
    presigned = "https://b.s3/k?awsaccesskeyid=AKIA1&expires=1&signature=s"
    assert redact_credentials(presigned) == "https://b.s3/k?awsaccesskeyid=***&expires=1&signature=***"
    assert redact_credentials("'ACCOUNTKEY=k3y;accountname=a'") == "'ACCOUNTKEY=***;accountname=a'"
    assert redact_credentials("'sortkey=a primarykey=b keyid=c'") == "'sortkey=a primarykey=b keyid=c'"


def test_redact_credentials_drops_signed_authorization_schemes_and_a_bare_password_with_an_at() -> None:
    """SigV2's ``AWS id:signature``, GCS's HMAC and Azure's SharedKeyLite headers; DuckDB's file:// authority error
    quoting a password that holds an '@'."""
    for header, scheme in (
        ("Authorization: AWS AKIAIOSFODNN7EXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg=", "AWS"),
        ("Authorization: GOOG4-HMAC-SHA256 Credential=GOOG1E/x, Signature=abc", "GOOG4-HMAC-SHA256"),
        ("Authorization: SharedKeyLite acct:c2lnbmF0dXJl", "SharedKeyLite"),
    ):
        assert redact_credentials(header) == f"Authorization: {scheme} ***"
    assert redact_credentials("authorization: AWS credentials missing") == "authorization: AWS credentials missing"
    assert redact_credentials("got: alice:p@ss@127.0.0.1:9") == "got: alice:***@127.0.0.1:9"


def test_redact_credentials_drops_a_password_holding_a_single_quote() -> None:
    """RFC 3986 allows ``'`` in a password unescaped, and DuckDB echoes a string literal's ``''`` as one ``'``."""
    assert redact_credentials("string 'http://u:pa'ss@h/x' to INT32") == "string 'http://u:***@h/x' to INT32"
    assert redact_credentials("read_csv('mysql://root:it's@db/x')") == "read_csv('mysql://root:***@db/x')"
    # a quote ending the URL is no part of it: the next quoted string's '@' is not the URL's
    assert redact_credentials("'http://u:pw@h/x' or 'a@b'") == "'http://u:***@h/x' or 'a@b'"
    # found by review: SQL text (a parser error's LINE 1, EXPLAIN) writes the quote doubled, and kept the password
    assert redact_credentials("LINE 1: read_csv('http://u:it''s@h.c/x')") == "LINE 1: read_csv('http://u:***@h.c/x')"
    assert redact_credentials("'postgresql://a:pw&''@[::1]/db', x") == "'postgresql://a:***@[::1]/db', x"


def test_redact_credentials_drops_a_password_written_with_blanks_around_its_equals_sign() -> None:
    """libpq reads ``password = pw`` as ``password=pw``; DuckDB's postgres extension quotes the string it failed
    with."""
    assert redact_credentials('Unable to connect to Postgres at "host=h password = s3cret dbname=d"') == (
        'Unable to connect to Postgres at "host=h password = *** dbname=d"'
    )
    assert redact_credentials("\"host=h PWD = 'p w' port=5\"") == '"host=h PWD = *** port=5"'
    # any credential's name, and SQL's comparison with it too (over-redaction: the lesser evil)
    assert redact_credentials("WHERE token = 5 AND key = 1") == "WHERE token = *** AND key = 1"


@pytest.mark.parametrize("name", ["passwd", "passphrase", "secret_access_key", "AccountKey", "client_secret", "token"])
def test_redact_credentials_drops_any_credential_written_with_blanks_around_its_equals_sign(name: str) -> None:
    """Found by review: only ``password``/``pwd`` were read with blanks around ``=``: MySQL's ``passwd = x``, a
    ``passphrase = x`` and SQL's ``WITH (secret_access_key = 'x')`` were shown."""
    assert redact_credentials(f"conn: host=h {name} = s3Cr#t/x@1 port=1") == f"conn: host=h {name} = *** port=1"
    assert redact_credentials(f"WITH ({name} = 'a b', region = 'eu')") == f"WITH ({name} = ***, region = 'eu')"
    assert redact_credentials("token_count = 3, key = 1") == "token_count = 3, key = 1"


def test_redact_credentials_drops_the_secret_options_of_duckdbs_create_secret() -> None:
    """DuckDB's ``CREATE SECRET`` writes an option as ``NAME 'value'`` (no ``=``): a statement echoed in an error or
    a log showed its keys. Prose quoting a value after such a word keeps it."""
    statement = "CREATE SECRET s (TYPE s3, KEY_ID 'AKIAX', SECRET 'wJalr/K7+x', SESSION_TOKEN \"Fw o\", REGION 'eu')"
    assert redact_credentials(statement) == (
        "CREATE SECRET s (TYPE s3, KEY_ID ***, SECRET ***, SESSION_TOKEN ***, REGION 'eu')"
    )
    assert redact_credentials("create secret (secret\t'a b', type s3)") == "create secret (secret\t***, type s3)"
    assert redact_credentials("Binder Error: near SECRET 'x'") == "Binder Error: near SECRET 'x'"
    assert redact_credentials("(TYPE 's3', PROVIDER 'config')") == "(TYPE 's3', PROVIDER 'config')"


def test_redact_credentials_drops_all_of_a_connection_string_value_holding_a_hash_a_quote_or_blanks() -> None:
    """Found by review: an unquoted ``name=value`` ended at a ``#``, a quote or a blank, so the rest of a password
    holding one was shown (``Pwd=ab#cd;``, ``password=ab'cd``, ADO.NET's ``Password=correct horse;``)."""
    for password in ("ab#cd", "ab'cd", 'ab"cd', "correct horse", "a b c#d"):
        assert redact_credentials(f"Server=h;Password={password};Db=x") == "Server=h;Password=***;Db=x"
    assert redact_credentials("host=h password=ab#cd port=1") == "host=h password=*** port=1"
    # a quoted string's own closing quote ends the value, and a name= after blanks is no password's
    assert redact_credentials("{'dsn': 'host=h password=abc', 'x': 1}") == "{'dsn': 'host=h password=***', 'x': 1}"
    assert redact_credentials("password=abc port=1; x") == "password=*** port=1; x"


def test_redact_credentials_drops_a_value_whose_quote_closes_early() -> None:
    """Found by review: a value starting with a quote ended at the next quote even when more of the word followed
    (``secret: ""YC0w``, ``password=''ab``), so the rest was shown; that quote is the value's own."""
    assert redact_credentials('config:\n  secret: ""YC0wIOGB\n  x: 1') == "config:\n  secret: ***\n  x: 1"
    assert redact_credentials("config:\n  apikey: '&:IJbv'sszq19\n  x: 1") == "config:\n  apikey: ***\n  x: 1"
    assert redact_credentials("host=h password=''ab'c port=1") == "host=h password=*** port=1"
    assert redact_credentials('host=h password = ""ab port=1') == "host=h password = *** port=1"
    # a quoted value closed before a delimiter keeps what follows
    assert redact_credentials("{secret: 'a b', region: 'eu'}") == "{secret: ***, region: 'eu'}"
    assert redact_credentials("Server=h;Password='a;b';Db=x") == "Server=h;Password=***;Db=x"


def test_redact_credentials_drops_a_whole_value_holding_a_credential_name_and_a_colon() -> None:
    """Found by review: a header rule read ``ab.Sig:`` inside an XML element's or a JSON member's value as a name,
    took the line to its end and the closing tag with it, so the element's rule no longer saw it and showed ``ab``."""
    assert redact_credentials("<Err><Pwd>BoSigBB.oGiZ:5kCV</Pwd><R>1</R></Err>") == "<Err><Pwd>***</Pwd><R>1</R></Err>"
    assert redact_credentials('{"password": "abSig: x", "r": 1}') == '{"password": "***", "r": 1}'


def test_redact_credentials_drops_an_authorization_value_of_an_unknown_scheme() -> None:
    """Found by review: ``Authorization: b K65BBXnq`` (a scheme SQE does not know, then a token) was kept as prose
    because its first word is a word; prose takes two."""
    assert redact_credentials("sent Authorization: b K65BBXnqEboz75JS\nnext") == "sent Authorization: ***\nnext"
    assert redact_credentials("Authorization: Custom tMnmsc2j0Cu=8") == "Authorization: ***"
    assert redact_credentials("authorization: principal lacks USAGE") == "authorization: principal lacks USAGE"


def test_redact_credentials_drops_a_letters_only_token_that_mixes_cases() -> None:
    """Found by review: a token of letters alone no longer than an English word passed for one, as a bare
    ``Bearer`` token or a URL's whole userinfo (``https://kfPKQiBFiO@h``); a word's shape is one case, or a capital
    then lower case, or a short acronym."""
    assert redact_credentials("Invalid token Bearer iXgaGnIIUArD given") == "Invalid token Bearer *** given"
    assert redact_credentials("see https://kfPKQiBFiO@h/x now") == "see https://***@h/x now"
    assert redact_credentials("Authorization: kfPKQiBFiO") == "Authorization: ***"
    for kept in (
        "use Bearer or Basic",
        "send a Bearer token",
        "ssh://git@h/x",
        "https://Alice.Smith@h/x",
        "ftp://CI@h",
    ):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_a_colon_separated_value_holding_a_quote() -> None:
    """Found by review: an unquoted ``key: value`` ended at a quote, so ``secret: ab'cd`` showed ``'cd``."""
    for value in ("ab'cd", 'ab"cd x', "a`b"):
        assert redact_credentials(f"config:\n  secret: {value}\n  region: eu") == "config:\n  secret: ***\n  region: eu"


def test_redact_credentials_drops_a_bare_password_holding_a_colon_or_a_slash() -> None:
    """Found by review: an authority quoted without its scheme ended its password at a ``:`` or a ``/`` before its
    ``@``, so ``u:a:b@h`` and ``u:a/b@h`` were shown whole."""
    for password in ("a:b", "a/b", "5uR:3/x", "a:b@c/d", "a::", "/JZ,5L6t)W", "/a/b"):
        assert redact_credentials(f"got: alice:{password}@db.local:9") == "got: alice:***@db.local:9"
    for kept in (
        "User: arn:aws:sts::12:assumed-role/r/bob@example.com is not authorized",
        "mailto:bob@example.com",
        "s3://b/a@b/c",
        "C:/Users/me/a@b.csv",
        "got: u:@h",
    ):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_a_credential_element_of_an_xml_error_body() -> None:
    """S3's SignatureDoesNotMatch answer names the signature sent and the access key; its StringToSign is no secret."""
    body = (
        "<Error><Code>SignatureDoesNotMatch</Code><AWSAccessKeyId>AKIAX1</AWSAccessKeyId>"
        "<StringToSign>AWS4-HMAC-SHA256</StringToSign><SignatureProvided>5d6f</SignatureProvided><Key>a/b</Key></Error>"
    )
    assert redact_credentials(body) == (
        "<Error><Code>SignatureDoesNotMatch</Code><AWSAccessKeyId>***</AWSAccessKeyId>"
        "<StringToSign>AWS4-HMAC-SHA256</StringToSign><SignatureProvided>***</SignatureProvided><Key>a/b</Key></Error>"
    )


def test_sqe_errors_never_hold_a_url_credential() -> None:
    error = QueryError("cannot read http://alice:hunter22@h/x?sig=abc")
    for text in (str(error), repr(error), str(pickle.loads(pickle.dumps(error)))):
        assert "hunter22" not in text and "abc" not in text and "http://alice:***@h/x?sig=***" in text
    assert CatalogError("at http://u:hunter22@h", status=500).args == ("at http://u:***@h",)


def test_iso_utc() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00+00:00"
    assert iso_utc(86_400.9, zulu=True) == "1970-01-02T00:00:00Z"  # Java Instant's form, to the second
    assert iso_utc(None) is None


@dataclass
class _Stats(Counters):
    done: int = 0
    peak: int = 0
    _hidden: int = 0


def test_counters_are_atomic_and_snapshots_hide_private_fields() -> None:
    stats = _Stats()

    def bump() -> None:
        for _ in range(1000):
            stats.add(done=1)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats.raise_to("peak", 5)
    stats.raise_to("peak", 3)
    assert stats.snapshot() == {"done": 4000, "peak": 5}


def test_a_message_past_the_limit_is_cut_at_a_blank_before_it_is_redacted() -> None:
    short = "at http://u:pw@h/x"
    assert redacted_message(short) == "at http://u:***@h/x"
    # a password straddling the limit: cut back to the blank before its URL, never shown in part
    head = "x " * 20
    text = head + "http://user:secret-password@host/path and more text"
    cut = redacted_message(text, limit=len(head) + 20)
    assert cut == f"{head[:-1]} … ({len(text) - len(head) + 1} more characters)"
    assert "secret" not in cut and "sec" not in cut
    assert redacted_message("y" * 100, limit=10) == "… (100 more characters)"  # no blank: nothing kept


def test_an_error_quoting_megabytes_keeps_a_bounded_message() -> None:
    """Found by review: a catalog error quoting a client's 8 MB property key was redacted whole (seconds of CPU
    per request); so was an engine error quoting a catalog's answer."""
    quoted = "key=" + "a=1;" * 2_000_000
    for error in (CatalogError(quoted), QueryError(quoted), CatalogServerError(quoted)):
        shown = str(error)
        assert len(shown) < MAX_MESSAGE_CHARS + 50 and shown.endswith("more characters)"), len(shown)


@pytest.mark.parametrize(
    "quoted",
    [
        "password='correct horse battery staple'",
        'password="correct horse battery staple"',
        'password = "correct horse battery staple"',
        '{"password": "correct horse battery staple"}',
        "{'client_secret': 'correct horse battery staple'}",
        'x-api-key: "correct horse battery staple"',
    ],
)
def test_a_quoted_credential_cut_in_the_middle_shows_none_of_its_words(quoted: str) -> None:
    """Found by review: the cut at a blank fell inside a quoted value holding blanks; its closing quote cut away,
    the value was not seen as one and its first words were shown (``password=***'correct horse … ``)."""
    text = f"error: {quoted} was refused"
    assert "correct" not in redact_credentials(text)
    for limit in range(len("error: "), len(text)):
        shown = redacted_message(text, limit=limit)
        assert not any(word in shown for word in ("correct", "horse", "battery")), (limit, shown)
    # an unterminated quoted credential runs to its line's end, as a value whose end is unsure goes whole
    assert "horse" not in redact_credentials(f"error: {quoted[:-12]}\nnext line")
    assert redact_credentials(f"error: {quoted[:-12]}\nnext line").endswith("\nnext line")


def test_counted_agrees_the_noun_with_its_number() -> None:
    """Found by review: messages said "takes 1 parameters" and "1 queries of this user are running"."""
    assert counted(1, "parameter") == "1 parameter"
    assert [counted(n, "query", "queries") for n in (0, 1, 2)] == ["0 queries", "1 query", "2 queries"]


def test_redact_credentials_drops_a_password_holding_a_question_mark_or_hash_after_digits() -> None:
    """Found by review: digits then ``?`` or ``#`` were read as a port and a query, so ``6?pw`` was shown."""
    assert redact_credentials("https://u:6?pw@db/") == "https://u:***@db/"
    assert redact_credentials("https://u:6#pw@db/x") == "https://u:***@db/x"
    assert redact_credentials("https://u:6?pw@db.local/x") == "https://u:***@db.local/x"
    assert redact_credentials("mysql://u:42?x=y@db.local:3306/d") == "mysql://u:***@db.local:3306/d"
    assert redact_credentials("'https://u:6?a@b@h'") == "'https://u:***@h'"
    # a port then a query's name=value holding an '@' may be a password too: all to the '@' goes
    assert redact_credentials("https://h:443?v=a@b") == "https://h:***@b"
    assert redact_credentials("http://h:80#a=b@c") == "http://h:***@c"
    assert redact_credentials("https://h:443?e=a@b.com") == "https://h:***@b.com"
    assert redact_credentials("http://h:80?x@y") == "http://h:***@y"


@pytest.mark.parametrize("password", ["12/x/y", "6?a=b", "6#k=v/w", "8080/p/q=", "1/"])
def test_redact_credentials_drops_a_password_starting_with_digits_then_a_slash_or_a_query(password: str) -> None:
    """Found by review: digits then ``/`` (with another ``/`` before the ``@``) or ``?``/``#`` and a ``name=`` were
    taken for a port, so the whole password was shown (``http://u:12/x/y@db``, ``http://u:6?a=b@db``). A port then
    an ``@`` is unsure: all to the ``@`` goes (``http://h:***@b.csv`` for ``http://h:9000/a@b.csv``)."""
    assert redact_credentials(f"read http://u:{password}@db/t now") == "read http://u:***@db/t now"
    assert redact_credentials(f"'s3://u:{password}@minio:9000/b'") == "'s3://u:***@minio:9000/b'"
    assert redact_credentials("http://h:9000/b/a.csv") == "http://h:9000/b/a.csv"  # no '@': a port


def test_redact_credentials_never_shows_the_rest_of_a_password_after_an_at() -> None:
    """Found by review: a lower-case one-label host and path after a password's ``@`` were kept, so
    ``http://u:p@ss/w@db`` showed ``ss/w``, part of the password ``p@ss/w``; and a dotted name or a port after an
    ``@`` (``p@h.io/x@db``, ``p@h:1/x@db``) was taken for the host. A password's end is unsure there: all to the last
    ``@`` goes, and ``http://u:pw@h/a@b`` loses its host and path instead."""
    for password in ("p@ss/w", "p@h.io/x", "p@h:1/x", "Xk@9q/Lm", "p@ss?w", "a@minio/bucket/x"):
        assert redact_credentials(f"read http://u:{password}@db/t now") == "read http://u:***@db/t now"
    assert redact_credentials("http://u:pw@h/a@b") == "http://u:***@b"
    assert redact_credentials("read http://u:pw@minio/warehouse/t/x@1 now") == "read http://u:***@1 now"


def test_redact_credentials_drops_all_of_a_bare_password_holding_an_at_and_a_slash() -> None:
    """Found by review: an authority quoted without its scheme showed the part of its password after an ``@`` and
    before a ``/`` (``u:***@ss.x/y@h``); an authority alone has no path, so its password runs to the last ``@``."""
    assert redact_credentials("u:p@ss.x/y@h") == "u:***@h"
    assert redact_credentials("got: alice:p@s/s@127.0.0.1:9") == "got: alice:***@127.0.0.1:9"
    for kept in ("s3://b/a@b/c", r"C:\Users\me\a@b.csv", "C:/Users/me/a@b.csv", "bob@example.com"):
        assert redact_credentials(kept) == kept


@pytest.mark.parametrize("escape", ["\\", "\\\\", "\\\\\\", "\\\\\\\\\\\\\\"])
def test_redact_credentials_drops_a_credential_member_of_json_escaped_in_a_string(escape: str) -> None:
    """Found by review: JSON quoted inside a JSON string (a log line's message holding a request body) escapes its
    quotes, and its credential members were not seen."""
    q = escape + '"'
    inner = escape * 2 + "\\" + '"'  # a quote inside the value, escaped once more
    body = f"{{{q}secret_access_key{q}: {q}wJal{inner}rX{q}, {q}region{q}: {q}eu{q}}}"
    shown = redact_credentials(f'{{"msg": "{body}"}}')
    assert shown == f'{{"msg": "{{{q}secret_access_key{q}: {q}***{q}, {q}region{q}: {q}eu{q}}}"}}'
    # missing its closing quote (a message cut inside it): the value runs to its line's end
    assert redact_credentials(f"{q}password{q}: {q}correct horse\nnext") == f"{q}password{q}: {q}***{q}\nnext"


@pytest.mark.parametrize(
    "name", ["s3_secret_access_key", "password", "client_secret", "token", "aws.session_token", "secretAccessKey"]
)
@pytest.mark.parametrize("value", ["wJalrXUt/K7MDENG", "'wJalrXUt K7MDENG'", '"wJalrXUt K7MDENG"', "abc"])
def test_redact_credentials_drops_a_colon_separated_credential_value(name: str, value: str) -> None:
    """Found by review: a credential written ``name: value`` (YAML, a config dump, a log line) was shown."""
    assert redact_credentials(f"config:\n  {name}: {value}\n  region: eu") == f"config:\n  {name}: ***\n  region: eu"


def test_redact_credentials_keeps_prose_after_a_credential_word_and_a_colon() -> None:
    for kept in (
        "no credentials in the call: send a catalog bearer token or Basic client_id:client_secret",
        "ExpiredToken: The provided token has expired.",
        "InvalidClientTokenId: The security token included in the request is invalid.",
        "NoCredentialsError: Unable to locate credentials",
        "Unauthorized: 401 Client Error",
        "not authorized to perform: secretsmanager:GetSecretValue on resource",
        "tls_key: cannot read key.pem",
        "KeyError: 'region'",
    ):
        assert redact_credentials(kept) == kept


@pytest.mark.parametrize("name", ["secret", "client_secret", "token", "s3_secret_access_key", "api_key", "AccountKey"])
@pytest.mark.parametrize("value", ["correct horse", "correct horse battery staple", "has river", "Correct horse"])
def test_redact_credentials_drops_a_passphrase_of_words_after_a_credential_key(name: str, value: str) -> None:
    """Found by review: two or more lower-case words after a credential key that names no password were taken for
    prose (``secret: correct horse`` stayed), so a passphrase was shown. Only SQE's diagnosis and an error code's
    capitalised sentence stay (the test above and ..._keeps_a_diagnosis_...)."""
    assert redact_credentials(f"config:\n  {name}: {value}\n  region: eu") == f"config:\n  {name}: ***\n  region: eu"
    assert redact_credentials(f"loaded {name}: {value}") == f"loaded {name}: ***"


@pytest.mark.parametrize("value", ["required horse", "none.of.it", "not a secret", "expected", "Input"])
def test_redact_credentials_keeps_a_diagnosis_word_only_as_a_diagnosis(value: str) -> None:
    """A passphrase starting with a diagnosis word is no diagnosis: only the word alone or SQE's phrase stays."""
    assert redact_credentials(f"password: {value}") == "password: ***"


def test_redact_credentials_drops_a_value_after_a_colon_without_a_blank() -> None:
    """Found by review: ``password:hunter2`` (a log line's) was kept as a plain name's IAM action; only a URL or
    ``secretsmanager:`` and an action's shape stay now."""
    assert redact_credentials("got password:hunter2 from env") == "got password:***"  # to the line's end
    assert redact_credentials("token:CorrectHorse") == "token:***"
    for kept in (
        "not authorized to perform: secretsmanager:GetSecretValue on x",
        "secretsmanager:*",
        "key_token://h/x",
    ):
        assert redact_credentials(kept) == kept


def test_redact_credentials_drops_cookie_header_values() -> None:
    """Found by review: ``Set-Cookie``/``Cookie`` headers carry session tokens and were shown."""
    assert redact_credentials("Set-Cookie: session=abc123; Path=/; HttpOnly\nVary: x") == "Set-Cookie: ***\nVary: x"
    assert redact_credentials("sent Cookie: sid=s3ss10n; theme=dark") == "sent Cookie: ***"
    assert redact_credentials("{'Set-Cookie': 'sid=abc; Path=/'}") == "{'Set-Cookie': '***'}"
    assert redact_credentials('{"cookie": "sid=abc"}') == '{"cookie": "***"}'


def test_redact_credentials_keeps_a_mailto_user_a_count_and_a_closing_parenthesis() -> None:
    """Found by review: small over-redactions: a ``mailto:`` address's user, a count named after tokens, and the
    ``)`` closing a call around ``password=...``."""
    for kept in ("write to mailto:bob@example.com", "token_count=3", "'maxTokenCount=3 password_length=12'"):
        assert redact_credentials(kept) == kept
    assert redact_credentials('{"token_type": "bearer", "access_token": "t0k"}') == (
        '{"token_type": "bearer", "access_token": "***"}'
    )
    assert redact_credentials("connect(password=x) failed") == "connect(password=***) failed"
    assert redact_credentials("f(password=x), y") == "f(password=***), y"
    assert redact_credentials("(password=x)) y") == "(password=***) y"  # a password's own ')' goes with it
    assert redact_credentials("password=ab)cd y") == "password=*** y"  # no '(' opened before: all of it
    assert redact_credentials("token_count=3 token=abc") == "token_count=3 token=***"


# Each rule added by review on adversarial text as long as a message may be: it completes and reads the text right
# (the million-character runs above are what would catch a quadratic rule).
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("head", "unit", "tail", "expected"),
    [
        ("", "a://u:1?x=", "a@b.c x", "@ a://u:***@b.c x"),  # no name=value before a nested URL's ':'
        ("", "a://u:1?x=a@", "b x", "@ a://u:***@b x"),  # a port's digits may be a password's
        ("", "a://u:p@h/", "a@b x", "@ a://u:***@b x"),
        ("u:", "p@s/", "s@h x", "@ u:***@h x"),
        ("", "(a:", "b@c x", "@ (a:***@c x"),
        ('\\"token\\": \\"', "\\\\", "\n x", '@ \\"token\\": \\"***\\"\n x'),
        ("", '\\"token\\": \\"x\\", ', "x", "@ <***>x"),
        ("", "\\\\", '"token" x', '@ <run>"token" x'),
        ("", "token: ", "x", "@ token: ***"),
        ("", "secret: the ", "end", "@ secret: ***"),
        ("", "ExpiredToken: The x. ", "end", "@ <run>end"),
        ("", "f(password=x)", " x", "@ f(password=***) x"),
        ("", "mailto:a@", "b x", "@ <run>b x"),
        ("", "token_count=1 ", "x", "@ <run>x"),
        ("", "Set-Cookie: a=b; ", "x", "@ Set-Cookie: ***"),
    ],
)
def test_review_redaction_rules_read_adversarial_messages_right(head: str, unit: str, tail: str, expected: str) -> None:
    run = unit * ((MAX_MESSAGE_CHARS - 100) // len(unit))
    text = f"@ {head}{run}{tail}"
    assert len(text) <= MAX_MESSAGE_CHARS  # redacted whole, not cut
    expected = expected.replace("<run>", run).replace("<***>", run.replace('\\"x\\"', '\\"***\\"'))
    assert redacted_message(text) == expected


def test_redact_credentials_keeps_a_diagnosis_after_a_credential_key() -> None:
    """SQE's own config errors name a secret's key and what is wrong with it: that stays readable."""
    for kept in (
        "catalog.client_secret: expected a string, got a list",
        "coordinator.token: required",
        "storage.secret_access_key: required",
        "catalog.client_secret: required when catalog.client_id is set",
        "password: missing",
        "catalog.token: unknown key",
        "catalog.token: must not be empty",
        "catalog.token (set by SQE_CATALOG__TOKEN): expected a string",
        "catalog.token: String should have at least 1 character",
    ):
        assert redact_credentials(kept) == kept
    assert redact_credentials("password: correct horse battery") == "password: ***"  # a passphrase, not prose


def test_redact_credentials_drops_a_bare_password_starting_with_an_at() -> None:
    """Found by comparing with the old rules: a schemeless password may start with its ``@``."""
    assert redact_credentials("got: u:@bc@h") == "got: u:***@h"
    assert redact_credentials("got: u:@@h") == "got: u:***@h"
    assert redact_credentials("got: u:@h") == "got: u:@h"  # nothing between: no password to hide
    # a credential key's colon without a blank: a value (a config dump's), or a URL's scheme
    assert redact_credentials("s3_secret:x") == "s3_secret:***"
    assert redact_credentials("key_token://h/x") == "key_token://h/x"


def test_redact_credentials_drops_generated_secrets_the_property_test_found() -> None:
    """Found by the generated secrets below: a quote then ``:`` or ``)`` inside a value ended it (``pw=ab':cd``);
    a ``;``-listed value's blanks were read only to a ``;``, so ``'Server=h;Password=a b'`` showed ``b`` and a quote
    before the ``;`` did too; a bearer token ended at an ``=`` inside it (``Bearer 3Fr=uOx``); two words then
    ``:`` passed for an Authorization's prose (``Authorization: swrx Bj:=w``)."""
    assert redact_credentials("conn: host=h AccountKey = ab':cd port=1") == "conn: host=h AccountKey = *** port=1"
    assert redact_credentials('conn: host=h secret_access_key=i0r")"NM port=1') == (
        "conn: host=h secret_access_key=*** port=1"
    )
    assert redact_credentials("'Server=h;Password=correct horse'") == "'Server=h;Password=***'"
    assert redact_credentials("Server=h;Pwd=ab m漢R';Db=x") == "Server=h;Pwd=***';Db=x"
    assert redact_credentials("{'dsn': 'Server=h;Password=a b', 'x': 1}") == "{'dsn': 'Server=h;Password=***', 'x': 1}"
    assert redact_credentials("sent Bearer 3Fr=uOxA3p5zoj\nnext") == "sent Bearer ***\nnext"
    assert redact_credentials('WWW-Authenticate: Bearer realm="x"') == 'WWW-Authenticate: Bearer realm="x"'
    assert redact_credentials("Authorization: swrx Bj:=wO171Oa") == "Authorization: ***"
    assert redact_credentials("Authorization: V V tRdRT0lmY") == "Authorization: ***"
    assert redact_credentials("conn: host=h passphrase = 'BR')S6wZ port=1") == "conn: host=h passphrase = *** port=1"
    assert redact_credentials('Server=h;SharedAccessSignature=2CL") 5yJBRu;Db=x') == (
        "Server=h;SharedAccessSignature=***;Db=x"
    )
    assert redact_credentials('Server=h;client_secret="FS4Vn" tGdMwbO59;Db=x') == "Server=h;client_secret=***;Db=x"
    assert redact_credentials("Server=h;Pwd=jGiF !xg'tCZm':;Db=x") == "Server=h;Pwd=***':;Db=x"
    assert redact_credentials('config:\n  api_key: "G" 0evt!l2s\n  x: 1') == "config:\n  api_key: ***\n  x: 1"
    # a token used as the whole userinfo may hold an '@': all to the last one before the path goes
    assert redact_credentials("see alice://rY@LbhRaCqJD@localhost/p now") == "see alice://***@localhost/p now"
    # a closing quote and mark stay: ('pw=x'), ATTACH '...password=x';
    assert redact_credentials("f('password=abc'), g") == "f('password=***'), g"
    assert redact_credentials("ATTACH 'host=h password=x';") == "ATTACH 'host=h password=***';"


# Generated secrets in every form redaction reads (a fixed seed: the same cases each run). A secret mixes letters,
# digits, the symbols a form can hold unescaped (@ / : ? # % and quotes where the form allows them) and non-ASCII;
# no five-character stretch of it may be shown. Found the defects of the tests above named "Found by review" that
# say "a generated secret".
_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_URL_SYMBOLS = "@/:?#%!$&()*+,;=-._~"
_PASSPHRASE_WORDS = ("correct", "horse", "battery", "staple", "the", "river", "has", "apple", "send", "required")
_CONNECTION_NAMES = ("password", "passwd", "Pwd", "passphrase", "AccountKey", "secret_access_key", "client_secret")
_KEY_NAMES = (*_CONNECTION_NAMES, "token", "api_key", "aws_session_token", "SharedAccessSignature", "secret")


def _generated_secret(rng: random.Random, symbols: str, *, unicode: bool = True) -> str:
    pool = _ALNUM * 3 + symbols + ("éßøΩЖ漢字ñ€" if unicode else "")
    secret = "".join(rng.choice(pool) for _ in range(rng.randint(10, 24))).strip()
    return secret if len(secret) >= 8 else _generated_secret(rng, symbols, unicode=unicode)


def _jwt(rng: random.Random) -> str:
    def part(value: bytes) -> str:
        return base64.urlsafe_b64encode(value).rstrip(b"=").decode()

    header, claims = json.dumps({"alg": "HS256"}).encode(), json.dumps({"sub": rng.random()}).encode()
    return f"{part(header)}.{part(claims)}.{part(rng.randbytes(16))}"


def _forms(rng: random.Random) -> Iterator[tuple[str, Callable[[random.Random], tuple[str, str]]]]:
    """(template with ``{S}``, a maker of (secret, the secret as the form writes it))."""

    def plain(symbols: str, *, unicode: bool = True) -> Callable[[random.Random], tuple[str, str]]:
        def make(r: random.Random) -> tuple[str, str]:
            secret = _generated_secret(r, symbols, unicode=unicode)
            return secret, secret

        return make

    def encoded(symbols: str) -> Callable[[random.Random], tuple[str, str]]:
        def make(r: random.Random) -> tuple[str, str]:
            secret = _generated_secret(r, symbols)
            return secret, quote(secret, safe="")

        return make

    def as_json(r: random.Random) -> tuple[str, str]:
        secret = _generated_secret(r, _URL_SYMBOLS + "'\" \\")
        return secret, json.dumps(secret)

    def as_repr(r: random.Random) -> tuple[str, str]:
        secret = _generated_secret(r, _URL_SYMBOLS + "'\" \\")
        return secret, repr(secret)

    def passphrase(r: random.Random) -> tuple[str, str]:
        words = " ".join(r.choice(_PASSPHRASE_WORDS) + r.choice(("", "", "x")) for _ in range(r.randint(2, 4)))
        return words, words

    def jwt(r: random.Random) -> tuple[str, str]:
        token = _jwt(r)
        return token, token

    host = rng.choice(["db.example.com", "h:5432", "127.0.0.1:9000", "[::1]:81", "localhost", "minio", "db"])
    path = rng.choice(["", "/", "/x", "/b/a@b.csv", "/w?x=1", "/p#f", "/a@b"])
    for scheme in ("http://", "postgresql://", "s3://", "http:\\/\\/", ""):
        yield f"see {scheme}alice:{{S}}@{host}{path} now", plain(_URL_SYMBOLS)
    yield f"see https://{{S}}@{host}{path} now", plain("-._~%")
    yield "next=https%3A%2F%2Falice%3A{S}%40" + quote(host, safe="") + "%2Fx ok", encoded(_URL_SYMBOLS)
    for name in ("X-Amz-Signature", "X-Amz-Security-Token", "X-Amz-Credential", "sig", "token", "key", "access_token"):
        for mark in "&;#":
            yield f"GET https://b.s3/k?v=1{mark}{name}={{S}}&z=2 failed", encoded(_URL_SYMBOLS + "'")
        yield f"GET https://b.s3/k?{name}={{S}}&z=2 failed", plain("-._~%/:@!$()*+,=?")
    for name in _KEY_NAMES:
        yield f"conn: host=h {name}={{S}} port=1", plain("@/:?#%!$()*+-._~'\"")
        yield f"Server=h;{name}={{S}};Db=x", plain("@/:?#%!$()*+-._~ '\"")
        yield f"conn: host=h {name}='{{S}}' port=1", plain('@/:?#%!$&()*+,;=-._~" ')
        yield f"conn: host=h {name} = {{S}} port=1", plain("@/:?#%!$()*+-._~'\"")
        yield f"config:\n  {name}: {{S}}\n  region: eu", plain(_URL_SYMBOLS + "'\" <>")
        yield f"config:\n  {name}: {{S}}\n  region: eu", passphrase
        yield f'config:\n  {name}: "{{S}}"\n  region: eu', plain(_URL_SYMBOLS + "' ")
        yield f"log {name}:{{S}}\nx", plain("@?#%!$&()*+,;=-._~")
        yield f'{{"region": "eu", "{name}": {{S}}, "x": 1}}', as_json
        yield f"{{'region': 'eu', '{name}': {{S}}, 'x': 1}}", as_repr
        yield f"<Error><Code>X</Code><{name}>{{S}}</{name}><R>1</R></Error>", plain(_URL_SYMBOLS + "'\" ")
    for header in ("Authorization: Bearer ", "authorization=Bearer ", "Proxy-Authorization: Bearer ", "Bearer "):
        yield f"sent {header}{{S}}\nnext", plain("-._~+/=", unicode=False)
    for header in ("Authorization: ", "X-Amz-Security-Token: ", "Cookie: ", "Set-Cookie: ", "x-api-key: "):
        yield f"sent {header}{{S}}\nnext", plain(_URL_SYMBOLS + " ;=")
    yield "sent X-Api-Key={S}\nnext", plain("-._~+/:@!$*")
    yield "sent Authorization: AWS AKIAIOSFODNN7EXAMPLE:{S}\nnext", plain("+/=", unicode=False)
    yield "headers={'Authorization': 'Bearer {S}'}", plain("-._~+/=", unicode=False)
    yield "Invalid token {S} given", jwt
    yield "'{S}'", jwt


def _escaped_json_cases(rng: random.Random) -> Iterator[tuple[str, str]]:
    for name in _KEY_NAMES:
        secret = _generated_secret(rng, _URL_SYMBOLS + "'\" \\")
        inner = json.dumps({"region": "eu", name: secret})
        yield secret, json.dumps({"msg": inner})
        yield secret, json.dumps({"msg": json.dumps({"inner": inner})})


def test_redact_credentials_never_shows_part_of_a_generated_secret_in_any_form() -> None:
    rng = random.Random(20261207)
    shown: list[tuple[str, str]] = []
    for _ in range(40):
        cases = [(template, *make(rng)) for template, make in _forms(rng)]
        cases += [("{S}", secret, text) for secret, text in _escaped_json_cases(rng)]
        for template, secret, written in cases:
            text = template.replace("{S}", written)
            redacted = redact_credentials(text)
            around = template.replace("{S}", " ")
            stretches = {secret[i : i + 5] for i in range(len(secret) - 4)}
            if any(part in redacted and part not in around and part.strip() for part in stretches):
                shown.append((text, redacted))
    assert not shown, shown[:5]


def test_an_oauth_error_codes_description_stays_readable() -> None:
    """Found by CI: the ``key: value`` rule read ``unauthorized_client`` (it holds "auth") as a credential's key
    and hid the catalog's description, so the engine's delegation error no longer said why it was refused."""
    message = "catalog refused to delegate (HTTP 400 unauthorized_client: principal impostor_x is not a reader)"
    assert redact_credentials(message) == message
    assert redact_credentials("invalid_grant: token tok_abc expired") == "invalid_grant: token tok_abc expired"
    assert redact_credentials("client_secret: impostor_x1") == "client_secret: ***"


def test_without_secrets_blanks_pieces_of_a_sent_token_and_keeps_the_prose() -> None:
    token = "eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLW9mLWFsaWNlcy10b2tlbg"
    text = f"token {token[:-4]} rejected; {token[-20:]} too; {token[:15]} is short; secret p4ss unknown"
    expected = f"token *** rejected; *** too; {token[:15]} is short; secret *** unknown"
    assert without_secrets(text, [token, "p4ss", ""]) == expected, "a piece under 16 characters is no token's"
    assert without_secrets("nothing sent", []) == "nothing sent"
    encoded = "percent-encoded: a%20b%2Bc%40d%3D1, as a form body has it: a+b%2Bc%40d%3D1"
    assert without_secrets(encoded, ["a b+c@d=1"]) == "percent-encoded: ***, as a form body has it: ***"
