"""The schema guard's reader classes: readers resolve alike unless a policy or entry tells them apart."""

from __future__ import annotations

import random

from sqe_catalog.policies.schema_change import mentions_of, reader_classes
from sqe_catalog.policies.store import Policy, PolicyType


def _policy(kind: PolicyType, expression: str) -> Policy:
    return Policy("wh", "p", kind, "", {"expression": expression}, True, 1, "root", 0.0, "root", 0.0)


_MASK = 'mask := action("show-last-4") if is_group_member("a") else := action("replace-with-null")'
_NO_GROUP: frozenset[str] = frozenset()


def _readers(memberships: dict[str, frozenset[str]], *policies: Policy, **entries: list[str]) -> list[tuple[str, ...]]:
    mentions = mentions_of(policies, entries.get("users", []), entries.get("groups", []))
    known = frozenset(g for groups in memberships.values() for g in groups)
    return [(r.user, *sorted(r.groups)) for r in reader_classes(memberships, known, mentions)]


def test_names_are_those_compared_with_session_user_and_those_with_entries() -> None:
    policies = [
        _policy(PolicyType.ROW_FILTER, 'filter := true if session_user() == "carol" else := col("r") in ["EU"]'),
        _policy(PolicyType.COLUMN_MASK, _MASK),
        _policy(PolicyType.ROW_FILTER, "filter := x"),  # unparseable: fails for everyone, left out
    ]
    mentions = mentions_of(policies, ["dave"], ["entry-group"], [{"required-row-filter": {"right": "FR"}}])
    assert mentions.names == {"carol", "dave"}, "EU is compared with a column: no user name is"
    assert len(mentions.rules) == 2 and mentions.entry_groups == {"entry-group"}
    # A user's name as a filter's value: a name equal to any string (another filter's, an entry's) may resolve apart.
    as_value = _policy(PolicyType.ROW_FILTER, 'filter := col("owner") == session_user()')
    assert mentions_of([*policies, as_value], [], [], [{"right": "FR"}]).names == {"carol", "EU", "FR"}


def test_one_reader_per_class_one_per_name_not_taken_yet_and_one_for_anyone_else() -> None:
    memberships = {
        "alice": frozenset({"a", "x"}),
        "bob": frozenset({"x"}),  # x is named nowhere: bob resolves as erin does
        "carol": frozenset(),  # named by an entry: her own class
        "erin": frozenset(),
        "frank": frozenset({"a"}),  # as alice
    }
    mask = _policy(PolicyType.COLUMN_MASK, _MASK)
    assert _readers(memberships, mask, users=["carol"]) == [("alice", "a", "x"), ("bob", "x"), ("carol",)]
    assert _readers({"alice": frozenset({"a"})}, mask, users=["carol"]) == [("alice", "a"), ("carol",), ("",)]


def test_readers_are_told_apart_by_the_branch_that_holds_not_by_every_group_they_are_in() -> None:
    # Found by review: a class per combination of the groups policies name made 2,000 principals in 3 of 50
    # region groups about 2,000 classes, each resolved on every schema commit (seconds per commit). What a
    # first-match chain resolves to depends only on the branches up to the first that holds.
    chain = " else := ".join(f'col("region") == "R{g}" if is_group_member("g{g}")' for g in range(50))
    policy = _policy(
        PolicyType.ROW_FILTER, f'filter := true if is_group_member("admins") else := {chain} else := false'
    )
    shuffled = random.Random(7)
    memberships = {f"p{i}": frozenset(f"g{g}" for g in shuffled.sample(range(50), 3)) for i in range(2000)}
    memberships.update({"root": frozenset({"admins", "g1"}), "ann": frozenset({"admins"})})
    readers = _readers(memberships, policy)
    assert len(readers) <= 52, "one per first group that holds, one for admins, one for none"
    assert sum(1 for r in readers if "admins" in r) == 1, "root and ann resolve alike: admins comes first"
    # A condition a row decides does not end the chain: what follows it still tells readers apart (and a value
    # taken is told apart by what it folds: u1 and u2 both take region == "EU", whatever b says).
    row_dependent = 'true if col("region") == "EU" and is_group_member("a") else := true if is_group_member("b")'
    mixed = {"u1": frozenset({"a"}), "u2": frozenset({"a", "b"}), "u3": frozenset({"b"}), "u4": _NO_GROUP}
    assert len(_readers(mixed, _policy(PolicyType.ROW_FILTER, f"filter := {row_dependent} else := false"))) == 4
    taken = 'filter := col("region") == "EU" if is_group_member("a") else := true if is_group_member("b") else := false'
    assert _readers(mixed, _policy(PolicyType.ROW_FILTER, taken)) == [("u1", "a"), ("u3", "b"), ("u4",)]
