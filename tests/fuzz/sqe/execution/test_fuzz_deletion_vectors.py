"""Fuzz the deletion vector check and decoding (``sqe.execution.delete_limits``) and pyroaring's deserializers
with structure-aware mutations of real deletion vectors, in a child process.

A table's writer chooses a deletion vector's bytes; pyroaring's deserializers are compiled code. Every mutated
file must be refused with DeleteFileLimitError or decode to positions within its data file; pyroaring must
refuse a bad serialization or read it without crashing. The cases are fixed (seeded), so a run is
reproducible; ``SQE_FUZZ_CASES`` runs more locally.
"""

from __future__ import annotations

import os
from collections import Counter

from tests.fuzz.subprocess_cases import run_cases

CASES = int(os.environ.get("SQE_FUZZ_CASES", "600"))


def test_mutated_deletion_vectors_are_refused_or_decoded_within_their_data_file() -> None:
    outcomes = run_cases("tests.fuzz.sqe.execution.deletion_vector_cases", str(CASES))
    assert len(outcomes) == CASES
    seen = Counter(outcomes.values())
    assert {"refused", "decoded", "roaring-refused", "roaring-read"} <= set(seen), seen
