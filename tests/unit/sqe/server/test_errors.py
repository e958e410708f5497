"""What a Flight client is shown of an error: one line, typed, and never a secret of its session."""

from __future__ import annotations

from urllib.parse import quote

from sqe.errors import QueryError
from sqe.server.errors import to_flight

TOKEN = "eyJhbGciOiJub25lIn0.c3FlLXVzZXItdG9rZW4tdmFsdWU+/="


def test_a_token_straddling_the_messages_cut_leaves_no_head_of_it() -> None:
    # cut first and scrubbed after, the token's first characters stayed on the line
    error = to_flight(QueryError("x" * 470 + " " + TOKEN + " and more"), [TOKEN])
    assert TOKEN[:16] not in str(error) and "QueryError: xxx" in str(error)


def test_a_token_quoted_percent_encoded_or_cut_short_is_not_shown() -> None:
    error = to_flight(QueryError(f"refused ?t={quote(TOKEN, safe='')} after {TOKEN[:-4]}"), [TOKEN])
    assert quote(TOKEN, safe="")[:16] not in str(error) and TOKEN[:16] not in str(error)
    assert "refused ?t=*** after ***" in str(error)
