"""The DuckDB side of ``bench/vs_duckdb.py``: runs inside the separate DuckDB 1.5.5 virtualenv (the iceberg
extension wheels pin that version), driven over stdin/stdout, one JSON object a line.

Requests: ``{"op": "open", ...}`` attaches sqe-catalog with vended credentials on a new connection (extensions
installed from local ``.duckdb_extension`` files, never downloaded); ``{"op": "query", "sql": ...}`` runs a
query to an Arrow table and answers its wall time, row count and (for one-row results) the values;
``{"op": "close"}`` closes the connection. The client secret arrives on stdin and is never printed.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import duckdb

_con: Any = None


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _open(request: dict[str, Any]) -> dict[str, Any]:
    global _con
    if _con is not None:
        _con.close()
    con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    for path in request["extensions"]:
        con.execute(f"INSTALL {_quote(path)}")
    for name in ("httpfs", "avro", "iceberg"):
        con.execute(f"LOAD {name}")
    con.execute(f"SET enable_external_file_cache = {'true' if request['cache'] else 'false'}")
    con.execute(
        "CREATE SECRET sqe_ice (TYPE iceberg, "
        f"CLIENT_ID {_quote(request['client_id'])}, CLIENT_SECRET {_quote(request['client_secret'])}, "
        f"OAUTH2_SERVER_URI {_quote(request['catalog_uri'].rstrip('/') + '/v1/oauth/tokens')}, "
        f"OAUTH2_SCOPE {_quote(request['scope'])})"
    )
    con.execute(
        f"ATTACH {_quote(request['warehouse'])} AS ice (TYPE iceberg, SECRET sqe_ice, "
        f"ENDPOINT {_quote(request['catalog_uri'])}, ACCESS_DELEGATION_MODE 'vended_credentials')"
    )
    _con = con
    return {"ok": True}


def _query(request: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    table = _con.execute(request["sql"]).to_arrow_table()
    seconds = time.perf_counter() - started
    values = [_plain(v) for v in table.to_pylist()[0].values()] if table.num_rows == 1 else None
    return {"ok": True, "seconds": seconds, "rows": table.num_rows, "values": values}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str)) or value is None else str(value)


def main() -> int:
    global _con
    handlers = {"open": _open, "query": _query}
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "close":
            break
        try:
            answer = handlers[request["op"]](request)
        except Exception as exc:  # reported to the driver, which stops the benchmark with it
            answer = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(json.dumps(answer), flush=True)
    if _con is not None:
        _con.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
