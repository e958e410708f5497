"""``bench/soak.py``'s judge of an answer: it counts wrong, unrestricted and duplicated rows, never raises.

The short soak (``tests/soak``) only reaches the judge's counting when an answer is wrong; before this test the
count subtracted two ``Counter`` objects with ``^``, which ``Counter`` does not have, so the first wrong answer
ended the soak in a ``TypeError`` instead of being reported.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tests.helpers.bench_scripts import load_bench_script


def _soak() -> ModuleType:
    return load_bench_script("soak")


def _rows(*names: str) -> list[dict[str, Any]]:
    return [{"name": name} for name in names]


def test_an_exact_answer_is_judged_right() -> None:
    assert _soak().judge(_rows("a", "b"), [_rows("b", "a")], _rows("secret")) == (0, 0, 0)


def test_a_wrong_answer_counts_its_missing_extra_unrestricted_and_duplicated_rows() -> None:
    judge = _soak().judge
    # "a" twice (one duplicate), "b" missing, "secret" is a row the user may not see
    wrong, unrestricted, duplicated = judge(_rows("a", "a", "secret"), [_rows("a", "b")], _rows("secret"))
    assert (wrong, unrestricted, duplicated) == (3, 1, 1)


def test_the_closest_acceptable_answer_is_the_one_judged() -> None:
    judge = _soak().judge
    acceptable = [_rows("x", "y", "z"), _rows("a", "b")]
    assert judge(_rows("a"), acceptable, [])[0] == 1
