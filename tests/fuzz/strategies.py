"""Shared hypothesis strategies for the fuzz tests: arbitrary JSON and near-valid variants of it."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# Scalars a JSON decoder can produce, plus values that are easy to get wrong (huge ints, odd floats, unicode).
json_scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["", "a", "US", "id", "ns", "\x00", "é", "../x", "a.b", "\u2028", "1", "true", "null"]),
)


def json_values(keys: st.SearchStrategy[str] | None = None, max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Arbitrary JSON values, with object keys drawn from ``keys`` (near-valid documents) or any text."""
    key_strategy = keys if keys is not None else st.text(max_size=10)
    return st.recursive(
        json_scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(key_strategy, children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(st.text(max_size=10), json_values(), max_size=5)
