"""The conformance suite runs against the same real servers as the e2e tests (moto + ``sqe-catalog serve``).

The session fixtures are re-exported from ``tests/e2e/conftest.py``; pytest keeps one instance per defining
conftest, so a run that selects both ``tests/e2e`` and ``tests/conformance`` starts a second pair.
"""

from tests.e2e.conftest import catalog_server, moto_server

__all__ = ["catalog_server", "moto_server"]
