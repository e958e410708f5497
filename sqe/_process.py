"""How a console program (``sqe``, ``sqe-catalog``, ``sqe-worker``) starts and ends its process.

Start-up imports pyiceberg, pydantic, DuckDB, pyarrow and gRPC: hundreds of thousands of long-lived objects. Python's
cyclic collector walks the growing heap again and again while they are made, and at exit it walks every object once
more and tears down every module's reference cycles one by one. None of this frees anything the operating system
would not take back at once. So a program runs with collection off until its start-up is over, then freezes what
start-up built (``gc.freeze``: ignored by every later collection) and turns collection back on; at exit it freezes
the rest. Measured with ``bench/query_overhead.py``: see the README's "Start-up" paragraph.

The contract this sets for a program's code: **nothing may rely on a finalizer at exit to write data.** Objects
outside reference cycles are still freed by reference counting and ``atexit`` handlers still run (log handlers are
flushed by ``logging.shutdown``, the signed reads' pool is closed), but an object kept alive by a reference cycle at
exit (anything a module global holds: every module is a cycle) is left to the operating system unfinalized. SQE's
programs close what they write before ``main`` returns: sessions, output files, connections, servers.

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
