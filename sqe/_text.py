"""Small text helpers shared by every package: one-line error text, credentials taken out of locations, and
UTC timestamps for messages."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from urllib.parse import quote, quote_plus, unquote

# A word holding one of these names a credential, in any case: s3_secret_access_key, CREATE SECRET, mypassword,
# motherduck_token, X-Amz-Signature in a presigned URL, an Authorization: Bearer header, AccountKey= in Azure's
# connection string.
SECRET_STEMS = (
    "secret",
    "password",
    "passwd",
    "passphrase",
    "token",
    "credential",
    "signature",
    "bearer",
    "authoriz",
    "apikey",
    "cookie",  # Cookie and Set-Cookie headers carry session tokens
)
# Too short to find inside a word: a whole part of one (ODBC's Pwd=..., Azure's sig=..., a SAS token).
SECRET_PARTS = frozenset({"pwd", "sig", "sas"})
# A key is a credential's name only with one of these (access_key_id, KEY_ID, AccountKey, api_key, ENCRYPTION_KEY):
# sort_key, partition_key, primary_key or information_schema.key_column_usage name schema, not credentials.
KEY_QUALIFIERS = frozenset(
    [
        "access",
        "account",
        "api",
        "client",
        "encryption",
        "hmac",
        "id",
        "master",
        "private",
        "secret",
        "shared",
        "signing",
        "storage",
    ]
)
# A name whose last part is one of these measures a credential, never holds one (token_count, passwordLength,
# token_type: OAuth's "bearer").
MEASURE_PARTS = frozenset(
    ["count", "counts", "num", "len", "length", "size", "limit", "ttl", "type", "expiry", "expires", "expiration"]
)
_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")  # AccountKey: Account, Key; KEY_ID: KEY, ID
REDACTED = "***"
SCRUBBED = "[redacted]"  # what S3 keys and tokens give way to in worker and store errors
# A scheme and its ``//`` (JSON writes them ``:\/\/``). A scheme starts only where a run of letters and digits
# does (after a ``+``, ``.`` or ``-`` of ``svn+ssh``, which is left as it was), so each start is tried once.
_SCHEME = r"(?<![A-Za-z0-9])[A-Za-z][A-Za-z0-9]*:(?://|\\/\\/)"
# The user part has no ``/``, so a path's ``@`` is not userinfo, nor ``[``, so an IPv6 host is no user.
_USER = r"[^/?#@\s'\"`:\[\]]*"
# ``scheme://user:`` and the rest of the URL, to a blank or a quote (a ``'`` followed by more of the word is the
# password's, as RFC 3986 allows and DuckDB echoes a literal's ``''``; so is SQL text's ``''`` itself): the
# password runs to its last ``@`` (:func:`_without_passwords`).
_USERINFO = re.compile(rf"(?P<head>{_SCHEME}{_USER}:)(?P<tail>[^\s'\"`]*(?:'+[^\s'\"`]+)*)")
# ``scheme://name@``: a user name alone, or a token used as the whole userinfo (``https://ghp_x1@host``), to the
# last ``@`` before the path (a token may hold one: ``https://rY@Lb@h`` showed ``Lb``).
_USER_ONLY = re.compile(rf"(?P<scheme>{_SCHEME})(?P<user>[^/?#@\s'\"`:\[\]]+(?:@[^/?#@\s'\"`:\[\]]+)*)(?=@)")
# A user name kept as it is: words of letters, each lower-case, capitalised or a short acronym (``git``,
# ``first.last``, ``Alice``, ``CI``); anything else may be a token (``kfPKQiBFiO``: a generated one mixes cases).
_NAME_WORD = r"(?:[A-Z]?[a-z]{1,18}|[A-Z]{1,4})"
_USER_NAME = re.compile(rf"{_NAME_WORD}(?:[._-]{_NAME_WORD}){{0,3}}")
# Schemes whose userinfo names a container, never a credential (``abfss://container@account.dfs...``).
_CONTAINER_SCHEMES = frozenset({"abfs", "abfss", "wasb", "wasbs"})
# ``scheme%3A%2F%2Fuser%3Apassword%40host``: a URL percent-encoded whole (a redirect's ``?next=``); the password
# runs to the last ``%40`` before a blank, a quote or an ``&`` (which the encoding would have escaped). A scheme
# starts after an escape too (``mongodb%2Bsrv%3A``, ``jdbc%3Amysql%3A``), as ``_SCHEME`` does after ``+`` or ``:``.
_ENCODED_SCHEME = r"(?:(?<![A-Za-z0-9])|(?<=%[0-9A-F]{2}))[A-Za-z][A-Za-z0-9]*%3A%2F%2F"
_ENCODED_USER = r"[^\s'\"`%/?#&@:]*(?:%(?!3A|2F|40)[0-9A-F]{2}[^\s'\"`%/?#&@:]*)*"
_ENCODED_USERINFO = re.compile(
    rf"(?P<head>{_ENCODED_SCHEME}{_ENCODED_USER}%3A)(?P<tail>[^\s'\"`&]*)",
    re.IGNORECASE,
)
# ``scheme%3A%2F%2Ftoken%40host``: :data:`_USER_ONLY` percent-encoded; its user has no ``%3F`` or ``%23`` either, so
# an ``@`` in a query or fragment (``%3Femail%3Da%40b.com``) is no userinfo's.
_ENCODED_USER_ONLY = re.compile(
    rf"(?P<scheme>{_ENCODED_SCHEME})(?P<user>[^\s'\"`%/?#&@:]*(?:%(?!3A|2F|40|3F|23)[0-9A-F]{{2}}[^\s'\"`%/?#&@:]*)*)"
    r"(?=%40)",
    re.IGNORECASE,
)
# A header's name in free text: a hyphenated word (``X-Amz-Security-Token:``, ``x-api-key=``) or Authorization; or
# any word before a colon, as YAML or a config dump writes a key (``s3_secret_access_key: ...``). A name starts only
# where a run of its characters does, and each match ends at its separator: linear time.
_HEADER_NAME = re.compile(
    r"(?<![\w/@.:%-])(?P<name>[A-Za-z][\w.]*-[\w.-]*|authorization|[A-Za-z][\w.]*(?=[ \t]*:))"
    r"[ \t]*(?P<sep>[:=])[ \t]*",
    re.IGNORECASE,
)
# A ``key:``'s value that is SQE's own diagnosis of a credential's key, never a value: a word saying it is absent
# or wrong, alone (``coordinator.token: required``), or a phrase SQE's config errors start with (``required when``,
# ``expected a``) or pydantic's (``Input should be``). Lower-case words otherwise are a passphrase's shape
# (``secret: correct horse``): they go.
_DIAGNOSIS = re.compile(
    r"(?:(?i:required|missing|invalid|unknown(?: key)?|unset|empty|expired|revoked|denied|none|null|not set)"
    r"(?=[ \t]*(?:[\r\n,;)]|[.](?!\S)|\Z))"
    r"|(?:required when|requires|expected (?:a|an|one of)|must (?:be|not|have)|set either)[ \t]"
    r"|(?:Input|String|Value|Field) (?:should|error|required))"
)
# OAuth's error codes (RFC 6749 5.2, RFC 6750 3.1, RFC 8693 2.2.2): a catalog's error answer writes one before its
# ``error_description`` (``unauthorized_client: principal x is not a reader``), which is prose, never a credential.
_OAUTH_ERROR_CODES = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "invalid_target",
        "invalid_token",
        "insufficient_scope",
        "access_denied",
    }
)
# An error code naming a credential (S3's ``ExpiredToken``, STS's ``InvalidClientTokenId``, botocore's
# ``NoCredentialsError``) followed by a capitalised sentence (``The provided token has expired.``): prose. A config
# key is never shaped so, and only these words mark one.
_ERROR_CODE_PARTS = frozenset(
    {"expired", "invalid", "missing", "malformed", "unrecognized", "incomplete", "bad", "no", "partial", "denied"}
    | {"required", "match", "exception", "error", "failed", "failure", "unauthorized"}
)
_ERROR_CODE = re.compile(r"(?:[A-Z][a-z]+){2,}")
_SENTENCE = re.compile(r"[A-Z][a-z]*[ \t]+[a-z]")
# ``name:value`` without a blank is a value (``password:hunter2``) unless a URL (``x_token://h``) or an IAM action
# of a service whose name holds a credential's word (``secretsmanager:GetSecretValue``).
_IAM_SERVICES = frozenset({"secretsmanager"})
_IAM_ACTION = re.compile(r"(?:[A-Z][a-z]+)+\*?(?![^\s,;.)'\"])|\*")
# An unquoted ``name=value``'s value: to the next ``&``, ``;`` or blank, and on past a quote that more of the word
# follows (``pw=ab'cd``: a password may hold one, as a URL's does; ``'pw=x', 'y'`` ends at the first quote).
# A quote is the value's own unless only closing marks and a blank, a delimiter or the end follow it
# (``'pw=x', 'y'``, ``('pw=x')``).
_OWN_QUOTE = r"['\"`]+(?![,)\]}:]*(?:[\s&;]|\Z))"
_UNQUOTED_WORD = rf"[^&;\s'\"`]*(?:{_OWN_QUOTE}[^&;\s'\"`]+)*"
# A quoted value: to its closing quote when a delimiter follows that, or to the line's end when it has none (a
# message cut inside it); else (``""ab``, ``'a'b``) the quote is the value's own, read as an unquoted one's.
_QUOTE_CLOSED = r"(?=[,)\]}]*(?:[\s&;]|\Z))"
# On a ``key:`` line, a quoted value ends at its quote only before the line's end or a flow mapping's ``,`` or ``}``.
_LINE_QUOTED = (
    r"'[^'\n]*(?:'(?=[ \t]*(?:[,}\]]|\r?\n|\Z))|(?=\n|\Z))|\"[^\"\n]*(?:\"(?=[ \t]*(?:[,}\]]|\r?\n|\Z))|(?=\n|\Z))"
)
_QUOTED = rf"'[^'\n]*(?:'{_QUOTE_CLOSED}|(?=\n|\Z))|\"[^\"\n]*(?:\"{_QUOTE_CLOSED}|(?=\n|\Z))"
# A header line's value runs to the line's end, quotes and all (``secret: ab'cd``); a ``name=value`` one to the next
# ``&``, ``;``, ``,`` or blank. A quoted value missing its closing quote (a message cut inside it) runs to the line's
# end, as every quoted one here.
_HEADER_VALUES = {
    ":": re.compile(rf"{_LINE_QUOTED}|[^\r\n]+"),
    "=": re.compile(rf"{_QUOTED}|[^&;,)\s'\"`]*(?:{_OWN_QUOTE}[^&;,)\s'\"`]+)*"),
}
# An Authorization value that is prose: two words of a word's shape (``principal lacks``); a token is not shaped
# so. Each is read this far only, as a line may hold many names.
_TWO_WORDS = re.compile(r"(?:[A-Z]?[a-z]{2,18}|[A-Z]{2,4})[.,;:]?[ \t]+[A-Z]?[a-z]{2,18}[.,;]?(?=\s|\Z)")
# ``user:password@host`` with no scheme before it (DuckDB quotes a file:// URL's authority alone): the password runs
# to the last ``@`` of its word (to a blank, a quote or a backslash: ``C:\dir\a@b`` is a path) that a name follows.
# An authority alone has no path, so a ``/`` or ``:`` after its user is the password's (``u:p@ss.x/y@h``,
# ``u:a:b@h``, ``u:/x@h``); it may start with an ``@`` (``u:@x@h``), not be empty. A ``//`` after the ``:`` is a
# scheme's, a ``/`` after a drive letter a path's (``s3://b/a@b``, ``C:/a@b``); ``mailto:bob@h`` names a mailbox
# and an ARN's ``@`` (``arn:aws:sts::1:assumed-role/r/bob@example.com``) a user name, no password.
# :func:`_without_bare_passwords` reads each word once.
_BARE_HEAD = re.compile(
    r"(?<![\w/:@.%+-])(?!(?i:mailto|arn|urn):)(?:[\w.%+-]{2,}:(?!//)|[\w.%+-]:(?!/))(?=[^\s'\"`\\])"
)
_BARE_WORD = re.compile(r"[^\s'\"`\\]*")
_NAME_START = re.compile(r"[\w\[]")
# ``?name=value`` or ``&name=value`` (``;`` too, and ``#``: an OAuth fragment's ``#access_token=``): a query
# parameter, wherever a message quotes a URL; or ``name=value`` starting a word or a quoted string, as connection
# strings write them (``password=...``, Azure's ``AccountKey=...``); a quoted value goes whole. Only a credential's
# value is read: another's may quote a URL whose parameters follow (``url=https://h/x?sig=...``). A name never
# holds a blank or a quote, so each start's name is its own: linear time.
_PARAMETER_NAME = re.compile(r"(?P<mark>[?&;#]|(?<![^\s'\"`]))(?P<name>[^=&;#?\s'\"`]+)=")
# An unquoted value runs past a ``#`` (a connection string's password may hold one; a URL's fragment goes with it)
# and on over blanks to a ``;`` that ends it (``Password=correct horse;``, ADO.NET's and ODBC's), unless a
# ``name=`` comes first; after a ``;`` (``Server=h;Password=a b``), to its line's or quoted string's end too. Each
# further word starts with a character of its own, so blanks split one way only: linear time.
_WORD_AFTER = rf"(?:[^&;=\s'\"`]|{_OWN_QUOTE}[^&;=\s'\"`])[^&;=\s'\"`]*(?:{_OWN_QUOTE}[^&;=\s'\"`]+)*"
_MORE_WORDS = rf"(?:['\"`]*[ \t]+{_WORD_AFTER})+"
# Before a ``;`` that ends the value, a quote and closing marks between words are the value's too (``ab\") cd;``);
# only after a quote, so a word and its separator never share a character: linear time.
_MORE_WORDS_TO_SEMICOLON = rf"(?:(?:['\"`]+[,)\]}}:]*)?[ \t]+{_WORD_AFTER})+(?=['\"`]*[,)\]}}:]*[ \t]*;)"
_PARAMETER_VALUE = re.compile(rf"(?:{_QUOTED}|{_UNQUOTED_WORD})(?:{_MORE_WORDS_TO_SEMICOLON})?")
_LISTED_END = r"[ \t]*(?:\r?\n|\Z)|['\"`][ \t]*(?:[,)\]}\r\n]|\Z)"
_LISTED_VALUE = re.compile(
    rf"(?:{_QUOTED})(?:{_MORE_WORDS_TO_SEMICOLON})?"
    rf"|{_UNQUOTED_WORD}(?:{_MORE_WORDS_TO_SEMICOLON}|{_MORE_WORDS}(?={_LISTED_END}))?"
)
# The same in a URL percent-encoded whole (``%3Fsig%3D...%26``, a presigned URL as a redirect's ``?next=``): a
# name or value never holds an encoded mark, so each start's name is its own: linear time.
_ENCODED_PARAMETER_NAME = re.compile(
    r"(?P<mark>%(?:3F|26|3B|23))(?P<name>[^\s'\"`%=&;#?]+(?:%(?!3F|26|3B|23|3D)[0-9A-F]{2}[^\s'\"`%=&;#?]*)*)%3D",
    re.IGNORECASE,
)
_ENCODED_PARAMETER_VALUE = re.compile(r"[^\s'\"`%&]*(?:%(?!26|3B|23)[0-9A-F]{2}[^\s'\"`%&]*)*", re.IGNORECASE)
# ``name = value`` with blanks around the ``=`` (libpq reads ``password = x`` as ``password=x``; a config dump or
# SQL's ``WITH (secret_access_key = '...')``): any credential's name, so SQL's ``token = 5`` goes too. A name never
# holds a blank and each match ends at its ``=``: linear time.
_SPACED_NAME = re.compile(r"(?<![\w.-])(?P<name>[A-Za-z_][\w.-]*)(?:[ \t]+=[ \t]*|[ \t]*=[ \t]+)")
_SPACED_VALUE = re.compile(rf"{_QUOTED}|{_UNQUOTED_WORD}")
# An option of DuckDB's ``CREATE SECRET (TYPE s3, KEY_ID '...', SECRET '...')``: a name, blanks, then a quoted value,
# first in a parenthesised list or after a comma (so prose such as "near SECRET 'x'" keeps its quote).
_OPTION_NAME = re.compile(r"(?<=[(,])[ \t]*(?P<name>[A-Za-z_]\w*)[ \t]+(?=['\"])")
_OPTION_VALUE = re.compile(_QUOTED)
# An Authorization header's value after its scheme, to the line's end or a quote, as a header line, a dict's or a
# tuple's repr shows it (AWS's holds the credential and the signature, comma-separated). Only with a scheme named:
# "authorization: principal lacks ..." is a message.
_AUTHORIZATION_HEAD = (
    r"\b(?:proxy-)?authorization\w*['\"]?\s*[:=,]\s*b?['\"]?"
    r"(?:bearer|basic|digest|negotiate|ntlm|token|oauth|sharedkey(?:lite)?|aws4-hmac-sha256|goog4-(?:hmac|rsa)-sha256"
    r"|aws(?=\s+[\w-]+:))\s+"
)
_AUTHORIZATION = re.compile(rf"(?P<head>{_AUTHORIZATION_HEAD})[^\r\n'\"`]+", re.IGNORECASE)
_AUTHORIZATION_SCHEME = re.compile(_AUTHORIZATION_HEAD, re.IGNORECASE)
_SCHEME_KEPT = re.compile(r"[\w-]+[ \t]+\*\*\*(?![^\s,])")  # its rule ran first: ``AWS ***``

# A bearer token without its header's name (a catalog's "Invalid token Bearer eyJ..."): anything but a word's
# shape (lower-case, capitalised or a short acronym, no longer than an English word), so "use Bearer or Basic" stays.
# A token runs past an ``=`` inside it (``3Fr=uOx``: none but padding in RFC 6750, but one that breaks it is still a
# token); a word and one ``=`` (``Bearer realm="x"``) is a challenge's parameter.
_BEARER = re.compile(r"(?P<head>\bbearer\s+)(?P<token>[\w.~+/-]+(?:=+[\w.~+/-]+)*=*)", re.IGNORECASE)
_BEARER_WORD = re.compile(r"(?:[A-Z]?[a-z]{1,18}|[A-Z]{1,4})[.,;:]?")
# A JSON Web Token anywhere (a quoted string DuckDB echoes, a catalog's message): its base64url header starts
# ``eyJ``. A token starts only where a run of its characters does, so each run is looked at once.
_JWT = re.compile(r"(?<![\w-])eyJ[\w-]*\.[\w-]+\.[\w-]*")
# Credential shapes for text kept on disk (the shell's history), looser than the rules above as leaving a statement
# out costs nothing: ``://user:password@`` after any scheme or none, an AWS access key id (which errors may show), a
# JWT's header and payload anywhere, and a long run of letters and digits mixing both cases and digits, an API
# token's shape (a path has slashes).
_CREDENTIAL_SHAPES = (
    re.compile(r"://[^/@\s:]+:[^/@\s]+@"),
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
)
_TOKEN_RUN = re.compile(r"[A-Za-z0-9+=_-]{32,}")
# A JWT's header and payload: a base64url run holding ``eyJ`` at a word's start, then ``.`` and more. Each run is
# read once, from its start: trying every ``eyJ`` of a long run (``x-eyJx-eyJ...``) to its end took quadratic time.
_BASE64URL_RUN, _JWT_HEADER_START = (
    re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]+(?=\.[A-Za-z0-9_-])"),
    re.compile(r"\beyJ(?=[A-Za-z0-9_-])"),
)
# ``"name": "value"`` in JSON or ``'name': 'value'`` in a dict's repr (an OAuth answer, a client's options quoted
# in an error); an escaped quote stays in the value. Each value runs to its own closing quote: linear time.
_QUOTED_MEMBER = re.compile(
    r"(?P<head>(?P<quote>['\"])(?P<name>[\w.-]+)(?P=quote)\s*:\s*b?)"
    r"(?P<value>\"(?:[^\"\\\n]|\\.)*\"?|'(?:[^'\\\n]|\\.)*'?)"
)

# The same member in JSON quoted inside a string, its quotes escaped by one run of backslashes or more
# (``{\\"secret_access_key\\": \\"...\\"}`` in a log line's message); a run starts only where backslashes do, and
# its value ends at the first quote after exactly as many (a quote escaped deeper has more): linear time.
_ESCAPED_MEMBER = re.compile(
    r"(?<!\\)(?P<head>(?P<escape>\\+)(?P<quote>['\"])(?P<name>[\w.-]+)(?P=escape)(?P=quote)\s*:\s*(?P=escape)(?P=quote))"
)

# ``<SignatureProvided>value</SignatureProvided>`` in an XML error body (S3's SignatureDoesNotMatch). A value holds
# no ``<``, so each runs to its own next tag: linear time.
_XML_ELEMENT = re.compile(r"(?P<head><(?P<name>[\w.-]+)>)[^<\n]*(?=</(?P=name)>)")


def first_line(value: BaseException | str, *, limit: int | None = None) -> str:
    """The first non-empty line of an exception's (or a string's) text; the exception's type name if empty.

    Errors are shown to users on one line, so multi-line library messages are cut here, never re-wrapped. A
    ``limit`` cuts after :func:`redact_credentials`: cut inside a URL's password, the rest would not show it as one.
    """
    text = str(value).strip()
    if not text:
        return type(value).__name__ if isinstance(value, BaseException) else ""
    line = text.splitlines()[0].strip()
    return line if limit is None else redact_credentials(line)[:limit]


def terminal_line(value: BaseException | str) -> str:
    """:func:`first_line` with control characters escaped: for a terminal, where an error echoing a table name
    or a catalog's message must not move the cursor, recolour or rewrite the screen."""
    return escape_unprintable(first_line(value))


def escape_for_terminal(text: str) -> str:
    """:func:`escape_unprintable` with a backslash doubled, so the text ``\\x1b`` never reads as an escaped ESC.

    For values and names shown on a terminal (the table format), where the escaping must be unambiguous.
    """
    return escape_unprintable(text.replace("\\", "\\\\"))


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """``count`` and the noun it takes: ``1 parameter``, ``2 parameters``; ``plural`` for irregular nouns
    (``counted(n, "query", "queries")``)."""
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


_TOKEN_KEY_DIGEST = re.compile(r"\btoken:([0-9a-f]{16})[0-9a-f]+")


def short_identity(key: str) -> str:
    """An identity key as logs and reprs show it: the digest of a ``token:<hex>`` key (a user or principal known
    only by an opaque token) cut to its first 16 hex digits. Keys are compared whole (collisions of 64 bits are
    within reach); a log line only needs to tell users apart for a reader, and shows less of the token's digest."""
    return _TOKEN_KEY_DIGEST.sub(r"token:\1", key)


def iso_utc(epoch_seconds: float | None, *, zulu: bool = False) -> str | None:
    """Epoch seconds as an ISO-8601 UTC timestamp to the second; None stays None. ``zulu`` writes the zone as
    ``Z`` (as Java's ``Instant`` does, for Gravitino-shaped answers) instead of ``+00:00``."""
    if epoch_seconds is None:
        return None
    text = datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="seconds")
    return text.removesuffix("+00:00") + "Z" if zulu else text


def escape_unprintable(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped as Python does (``\\n``, ``\\x1f``).

    For errors that echo client input (a key, a path segment): the message must stay one line.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def names_secret(word: str) -> bool:
    """``word`` holds a credential's name (X-Amz-Signature, sig, mypassword), or a credential key's (access_key_id,
    KEY_ID, AccountKey, accesskey), not any key's (PRIMARY KEY, sort_key, a map's 'key')."""
    lowered = word.lower()
    if any(stem in lowered for stem in SECRET_STEMS):
        return not _names_a_measure(word)
    if "key" not in lowered and not any(part in lowered for part in SECRET_PARTS):
        return False  # nothing below can hold: a hostile text's many names are each rejected at this cost
    parts = {*re.split(r"[_-]", lowered), *(part.lower() for part in _PART.findall(word))}
    if SECRET_PARTS & parts:
        return True
    keyed = "key" in parts and bool(KEY_QUALIFIERS & parts)
    # all one word in one case (awsaccesskeyid, ACCOUNTKEY) has no parts to split; "idkey" is too short to look for
    joined = any(f"{qualifier}key" in lowered for qualifier in KEY_QUALIFIERS if len(qualifier) > 2)
    named = keyed or joined or any(f"{qualifier}key" in parts for qualifier in KEY_QUALIFIERS)
    return named and not _names_a_measure(word)


def _names_a_measure(word: str) -> bool:
    """``word``'s last part measures what it names (token_count, maxTokenCount, token_type): no credential."""
    words = _PART.findall(word)
    return bool(words) and words[-1].lower() in MEASURE_PARTS


def has_credential_shape(text: str) -> bool:
    """Whether ``text`` holds something :func:`redact_credentials` would take out (a URL's password, a token, a
    credential parameter or header) or a credential's shape (an AWS access key id, an API token's). For text kept on
    disk (the shell's history), where erring towards leaving it out costs nothing."""
    if _token_like(text) or _jwt_like(text) or any(shape.search(text) for shape in _CREDENTIAL_SHAPES):
        return True
    return redact_credentials(text) != text


def _jwt_like(text: str) -> bool:
    return any(_JWT_HEADER_START.search(text, run.start(), run.end()) for run in _BASE64URL_RUN.finditer(text))


def _token_like(text: str) -> bool:
    return any(
        any(c.islower() for c in run) and any(c.isupper() for c in run) and any(c.isdigit() for c in run)
        for run in _TOKEN_RUN.findall(text)
    )


# A piece this long of a secret SQE sent is blanked out too (:func:`without_secrets`): 96 bits and more of a token,
# far past any chance match of prose, and what a quote cut short leaves unshown is then too much to guess.
SECRET_PIECE_CHARS = 16


def without_secrets(text: str, secrets: Iterable[str], *, marker: str = REDACTED) -> str:
    """``text`` with every one of ``secrets`` (tokens, client secrets, S3 keys SQE sent) replaced by ``marker``,
    also as a form body or a URL's query percent-encodes it, and every piece of one of at least
    :data:`SECRET_PIECE_CHARS` characters too: a catalog, store or proxy may quote a token cut short, and all of a
    token's signature but its last characters is as good as the token to whoever can try those.

    For the text of an answer to a request that carried ``secrets``, before it is cut (a cut could leave a piece)."""
    given = [secret for secret in secrets if secret]
    # as sent in a form body (a catalog or proxy may quote that): a secret's reserved characters percent-encoded
    known = list(dict.fromkeys([*given, *(quote(s, safe="") for s in given), *(quote_plus(s) for s in given)]))
    for secret in sorted(known, key=len, reverse=True):
        text = text.replace(secret, marker)
    pieces = {
        secret[i : i + SECRET_PIECE_CHARS] for secret in known for i in range(len(secret) - SECRET_PIECE_CHARS + 1)
    }
    return _without_pieces(text, pieces, marker) if pieces else text


def _without_pieces(text: str, pieces: set[str], marker: str) -> str:
    """``text`` with every run covered by ``pieces`` (all :data:`SECRET_PIECE_CHARS` long) replaced by ``marker``."""
    covered_to = -1  # the end of the run being blanked
    runs: list[tuple[int, int]] = []
    for start in range(len(text) - SECRET_PIECE_CHARS + 1):
        if text[start : start + SECRET_PIECE_CHARS] not in pieces:
            continue
        end = start + SECRET_PIECE_CHARS
        if runs and start <= covered_to:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
        covered_to = end
    parts: list[str] = []
    copied = 0
    for start, end in runs:
        parts += [text[copied:start], marker]
        copied = end
    parts.append(text[copied:])
    return "".join(parts)


MAX_MESSAGE_CHARS = 8192  # an error message's length as shown; far past any message SQE words itself
_BLANKS = re.compile(r"\s")


def redacted_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """An error message as shown: :func:`redact_credentials` of at most ``limit`` characters of ``text``.

    Cut before redacting: redaction is linear but costs up to about a microsecond a character on dense text, and
    a message may quote whatever a client or a catalog sent (megabytes). The cut goes back to the last blank
    before the limit, so no credential is cut in two (half a password is not seen as one): a location holds no
    blank, and a quoted value cut there lost its closing quote, so runs to the kept text's end and goes whole."""
    if len(text) <= limit:
        return redact_credentials(text)
    blanks = [match.start() for match in _BLANKS.finditer(text, 0, limit)]
    kept = text[: blanks[-1]] if blanks else ""
    return f"{redact_credentials(kept)} … ({len(text) - len(kept)} more characters)".lstrip()


def redact_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``: a userinfo password
    (``http://alice:***@host``, also JSON-escaped or percent-encoded whole), a token used as the whole userinfo
    (``https://***@host``) and the value of a query parameter naming a credential (``X-Amz-Signature``,
    ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``sig``, ``token``, ``key``...), each also in a URL
    percent-encoded whole. The location itself stays,
    so a message still says which one it means. An ``Authorization: Bearer ***`` header's value goes too, and so
    does that of a header or a ``key:`` naming a credential (``X-Amz-Security-Token: ***``, ``Set-Cookie: ***``,
    ``s3_secret_access_key: ***``) and of a JSON member naming one, escaped inside a string too. Never showing a
    credential comes before keeping the rest readable: where a password's end is unsure, more goes.

    For any text quoting a location a user or a catalog supplied (errors, logs, EXPLAIN): such a location may be
    a presigned URL or carry a password."""
    if "@" in text:
        text = _USERINFO.sub(_redacted_userinfo, text)
        text = _USER_ONLY.sub(_redacted_user, text)
        text = _without_bare_passwords(text)
    if "%" in text:
        text = _ENCODED_USERINFO.sub(_redacted_encoded_userinfo, text)
        text = _ENCODED_USER_ONLY.sub(_redacted_user, text)
    text = _AUTHORIZATION.sub(_redacted_value, text)  # first: its value follows the scheme, after a blank
    text = _BEARER.sub(_redacted_bearer, text)
    if "eyJ" in text:
        text = _JWT.sub(REDACTED, text)
    # a value with its own end (a JSON member's, an XML element's) goes whole before a rule reading lines or words
    # could end inside it (``<Pwd>ab.Sig:cd</Pwd>`` held a ``Sig:`` header that ate the closing tag)
    if ":" in text:
        text = _QUOTED_MEMBER.sub(_redacted_member, text)
        if "\\" in text:
            text = _without_escaped_member_values(text)
    if "</" in text:
        text = _XML_ELEMENT.sub(_redacted_element, text)
    if ":" in text or "=" in text:
        text = _without_header_values(text)
    if "=" in text:
        text = _without_parameter_values(text, _PARAMETER_NAME, _PARAMETER_VALUE, _LISTED_VALUE)
        text = _without_spaced_values(text, _SPACED_NAME, _SPACED_VALUE)
    if "(" in text:
        text = _without_spaced_values(text, _OPTION_NAME, _OPTION_VALUE)
    if "%3D" in text or "%3d" in text:
        text = _without_parameter_values(text, _ENCODED_PARAMETER_NAME, _ENCODED_PARAMETER_VALUE)
    return text


def _redacted_userinfo(match: re.Match[str]) -> str:
    return match["head"] + _without_passwords(match["tail"])


def _without_passwords(tail: str) -> str:
    """A URL's ``tail`` after ``user:`` with all before its last ``@`` replaced: the password, and a port, host and
    path that an ``@`` follows.

    A password may hold ``@``, ``/``, ``:``, ``?`` and ``#`` unescaped (a generated one does), so no ``@`` before the
    last is surely its end, and digits then ``/``, ``?`` or ``#`` are no sure port: ``http://u:p@h.x:1/w@db`` may be
    user ``u`` and password ``p@h.x:1/w``, ``http://h:12/x/y@db`` user ``h`` and password ``12/x/y``. Any earlier end
    would show all or the rest of such a password; ``http://h:***@b.csv`` for ``http://h:9000/a@b.csv`` is the
    lesser harm. One ``rfind``: linear time."""
    last = tail.rfind("@")
    return tail if last < 0 else REDACTED + tail[last:]


def _without_bare_passwords(text: str) -> str:
    """``text`` with the password of every ``user:password@host`` quoted without its scheme replaced: to the last
    ``@`` of its word a name follows. A word's last ``@`` is looked for once, whatever the heads in it."""
    parts: list[str] = []
    copied = word_end = last_at = 0
    for head in _BARE_HEAD.finditer(text):
        start = head.end()
        if head.start() < copied:
            continue
        if start >= word_end:  # a new word: no head holds a blank, so one before word_end shares its word
            word_end = _BARE_WORD.match(text, start).end()  # type: ignore[union-attr]
            last_at = _last_named_at(text, start, word_end)
        if last_at > start:
            parts += [text[copied:start], REDACTED]
            copied = last_at
    parts.append(text[copied:])
    return "".join(parts)


def _last_named_at(text: str, start: int, end: int) -> int:
    """The last ``@`` in ``text[start:end]`` that a name or an IP literal's ``[`` follows; -1 for none."""
    at = text.rfind("@", start, end)
    while at >= 0 and not _NAME_START.match(text, at + 1, end):
        at = text.rfind("@", start, at)
    return at


def _without_spaced_values(text: str, names: re.Pattern[str], values: re.Pattern[str]) -> str:
    """``text`` with the value of every ``name = value`` (or SQL option ``NAME 'value'``) naming a credential
    replaced: ``names`` finds a name and ends where its value starts, ``values`` reads the value."""
    parts: list[str] = []
    copied = 0
    for name in names.finditer(text):
        if name.start() < copied or not names_secret(name["name"]):
            continue
        value = values.match(text, name.end())
        if value is None or value.end() == name.end():
            continue
        parts += [text[copied : name.end()], REDACTED]
        copied = value.end()
    parts.append(text[copied:])
    return "".join(parts)


def _redacted_user(match: re.Match[str]) -> str:
    scheme, user = unquote(match["scheme"]), unquote(match["user"])
    if _USER_NAME.fullmatch(user) or scheme[: scheme.index(":")].lower() in _CONTAINER_SCHEMES:
        return match[0]
    return match["scheme"] + REDACTED


def _redacted_encoded_userinfo(match: re.Match[str]) -> str:
    tail = match["tail"]
    at = tail.upper().rfind("%40")
    return match[0] if at < 0 else match["head"] + REDACTED + tail[at:]


def _without_header_values(text: str) -> str:
    """``text`` with the value of every header or ``key:`` naming a credential replaced (``X-Amz-Security-Token:
    ***``, ``s3_secret_access_key: ***``). Authorization keeps a scheme for its own rule and a plain word:
    "authorization: principal lacks ..."."""
    parts: list[str] = []
    copied = 0
    for name in _HEADER_NAME.finditer(text):
        if name.start() < copied or not names_secret(name["name"]) or _header_value_kept(text, name):
            continue
        value = _HEADER_VALUES[name["sep"]].match(text, name.end())
        if value is None:
            continue
        parts += [text[copied : name.end()], REDACTED]
        copied = value.end()
    parts.append(text[copied:])
    return "".join(parts)


def _header_value_kept(text: str, name: re.Match[str]) -> bool:
    """A credential-named header's or key's value that is no credential: an Authorization scheme or prose word, a
    status (``Unauthorized:``), an IAM action (``secretsmanager:GetSecretValue``), an error code's sentence or SQE's
    diagnosis (``catalog.client_secret: required``). A hyphenated header's and a ``name=``'s value always goes."""
    word = name["name"]
    plain = word.isascii() and word.isalpha()
    if word.lower() in _OAUTH_ERROR_CODES and name["sep"] == ":":
        return True  # its error_description follows
    if "authoriz" in word.lower():
        return (plain and word.lower() != "authorization") or _scheme_or_word_follows(text, name)
    if name["sep"] == "=" or "-" in word:
        return False
    if text[name.end() - 1] not in " \t":
        # YAML's key takes a blank after its colon: x_token://h is a URL, secretsmanager:GetSecretValue an action
        action = word.lower() in _IAM_SERVICES and _IAM_ACTION.match(text, name.end()) is not None
        return action or text.startswith("//", name.end())
    if _DIAGNOSIS.match(text, name.end()):
        return True
    return _names_an_error(word) and _SENTENCE.match(text, name.end()) is not None


def _names_an_error(word: str) -> bool:
    """``word`` is an error code's shape (``ExpiredToken``, ``InvalidClientTokenId``), not a config key's."""
    if not (word.isascii() and _ERROR_CODE.fullmatch(word)):
        return False
    return any(part.lower() in _ERROR_CODE_PARTS for part in _PART.findall(word))


def _scheme_or_word_follows(text: str, name: re.Match[str]) -> bool:
    """An Authorization name is followed by a scheme (whose rule keeps it) or a plain word (a message's prose)."""
    if _AUTHORIZATION_SCHEME.match(text, name.start()) or _SCHEME_KEPT.match(text, name.end()):
        return True
    return _TWO_WORDS.match(text, name.end()) is not None


def _redacted_value(match: re.Match[str]) -> str:
    return match["head"] + REDACTED


def _redacted_bearer(match: re.Match[str]) -> str:
    token = match["token"]
    return match[0] if _BEARER_WORD.fullmatch(token.removesuffix("=")) else match["head"] + REDACTED


def _redacted_member(match: re.Match[str]) -> str:
    value, name = match["value"], match["name"]
    # an Authorization value's scheme was kept by its own rule; any other value holding *** is still a credential
    if not names_secret(name) or ("authoriz" in name.lower() and REDACTED in value):
        return match[0]
    return match["head"] + value[0] + REDACTED + value[0]


def _without_escaped_member_values(text: str) -> str:
    """``text`` with the value of every credential-named member of escaped JSON replaced (``\\"token\\":
    \\"***\\"``): the value ends at the first quote after exactly its opening's backslashes, or at the line's end."""
    parts: list[str] = []
    copied = 0
    for member in _ESCAPED_MEMBER.finditer(text):
        if member.start() < copied or not names_secret(member["name"]):
            continue
        closing = member["escape"] + member["quote"]
        end = _escaped_closing(closing).search(text, member.end())
        parts += [text[copied : member.end()], REDACTED, closing]
        copied = len(text) if end is None else end.end()
        if end is not None and end[0] == "\n":
            copied -= 1  # no closing quote on its line: the line's break stays
    parts.append(text[copied:])
    return "".join(parts)


@functools.lru_cache(maxsize=32)
def _escaped_closing(closing: str) -> re.Pattern[str]:
    # a run of exactly this many backslashes (one more is a deeper escape's) and the quote, or the line's end
    return re.compile(rf"(?<!\\){re.escape(closing)}|\n")


def _redacted_element(match: re.Match[str]) -> str:
    return match["head"] + REDACTED if names_secret(match["name"]) else match[0]


def _without_parameter_values(
    text: str, names: re.Pattern[str], values: re.Pattern[str], listed: re.Pattern[str] | None = None
) -> str:
    """``text`` with the value of every query or connection-string parameter naming a credential replaced; ``listed``
    reads a value after a ``;``."""
    parts: list[str] = []
    copied = 0
    for head in names.finditer(text):
        if head.start() < copied or not _names_parameter_secret(head):
            continue
        value = (listed if listed is not None and head["mark"] == ";" else values).match(text, head.end())
        parts += [text[copied : head.end()], REDACTED]
        copied = head.end() if value is None else _before_closing_parenthesis(text, head, value.end())
    parts.append(text[copied:])
    return "".join(parts)


def _before_closing_parenthesis(text: str, head: re.Match[str], end: int) -> int:
    """A value's ``end`` before a ``)`` (and a ``,``, ``;`` or ``.`` after it) closing a ``(`` its name opened:
    ``connect(password=x)``. Only one, only then: a password's own ``)`` goes with it."""
    name = head["name"]
    if name.count("(") <= name.count(")"):
        return end
    closing = end - 1 if end - 1 > head.end() and text[end - 1] in ",;." else end
    return closing - 1 if closing - 1 > head.end() and text[closing - 1] == ")" else end


def _names_parameter_secret(head: re.Match[str]) -> bool:
    name = unquote(head["name"])
    # ?key=...: an API key in a URL; a word key=1 is no credential
    return names_secret(name) or (name.lower() == "key" and bool(head["mark"]))
