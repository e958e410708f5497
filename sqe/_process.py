"""How a console program (``sqe``, ``sqe-catalog``, ``sqe-worker``) starts and ends its process.

Start-up imports the program's libraries (pydantic, DuckDB and pyarrow for every program; SQLAlchemy, pyiceberg
and gRPC for the catalog and the worker): hundreds of thousands of long-lived objects. Python's cyclic collector
walks the growing heap again and again while they are made, and at exit it walks every object once more and tears
down every module's reference cycles one by one, freeing nothing the operating system would not take back at once.
So a program runs with collection off until its start-up is over, then freezes what start-up built (``gc.freeze``:
ignored by every later collection; a few thousand objects of import garbage, such as the tracebacks of caught
ImportErrors, go with it) and turns collection back on; at exit it freezes the rest. The README's "Start-up"
paragraph has the figures (``bench/query_overhead.py`` for ``sqe``, ``bench/process_start.py`` for the servers).

The contract this sets for a program's code: **nothing held by a module at exit is finalized.** On the Python this
project runs (3.11), the frozen module dictionaries are never cleared at exit, so an object a module global holds
(directly or not) gets no ``__del__`` and no cleanup. ``atexit`` handlers still run, so a resource that outlives the
process or holds data is released there or explicitly before ``main`` returns: log handlers are flushed by
``logging.shutdown``, the signed reads' pool is closed, the process-wide DuckDB database of partial aggregates is
closed by ``close_at_exit`` (DuckDB removes its spill directory only then), and sessions, output
files, connections and servers are closed before ``main`` returns.

Only a program's own process may call :func:`run_program`: in a process that calls ``main`` as a library (tests,
an embedding application), the collector's state is not SQE's to change.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["Started", "nothing", "run_program"]

Started = Callable[[], None]  # a program's main calls it once its start-up is over (then it serves or runs queries)


def run_program(main: Callable[[Started], int]) -> NoReturn:
    """Run ``main(started)`` as this whole process and exit with its status (an exception propagates as usual)."""
    gc.disable()
    try:
        code = main(_started)
    finally:
        gc.freeze()  # the exit's last collection then walks and tears down nothing (see the contract above)
    sys.exit(code)


def _started() -> None:
    gc.freeze()
    gc.enable()


def nothing() -> None:
    """The ``started`` of a ``main`` called as a library: the collector stays as the caller set it."""
