"""The catalog database's one SQLAlchemy ``MetaData``: every store declares its tables on it.

One schema root means one ``create_all`` creates a consistent database, and a store that needs another store's
table (restrictions checking that a principal exists) references that table object instead of re-declaring it.
"""

from __future__ import annotations

from sqlalchemy import MetaData

__all__ = ["METADATA"]

METADATA = MetaData()
