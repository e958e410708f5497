"""One base for objects that hold a secret (keys, tokens, client secrets) and so must never be pickled.

A pickle would carry the secret to wherever the bytes go (caches, queues, crash dumps); each subclass names in
``_pickle_refusal`` what it holds, so the refusal says why in one line.
"""

from __future__ import annotations

from typing import ClassVar, NoReturn


class Unpicklable:
    """Refuses ``pickle`` (and ``copy`` by reduction) with a one-line ``TypeError``."""

    __slots__ = ()
    _pickle_refusal: ClassVar[str] = "this object holds secrets and cannot be pickled"

    def __reduce__(self) -> NoReturn:
        raise TypeError(self._pickle_refusal)
