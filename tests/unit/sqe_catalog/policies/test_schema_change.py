"""The schema guard's reader classes: principals resolve alike unless a policy or entry tells them apart."""

from __future__ import annotations

from sqe_catalog.policies.schema_change import mentions_of, reader_classes
from sqe_catalog.policies.store import Policy, PolicyType


def _policy(kind: PolicyType, expression: str) -> Policy:
    return Policy("wh", "p", kind, "", {"expression": expression}, True, 1, "root", 0.0, "root", 0.0)


_MASK = 'mask := action("show-last-4") if is_group_member("a") else := action("replace-with-null")'


def test_mentions_are_the_groups_and_strings_of_policies_and_the_subjects_of_entries() -> None:
    policies = [
        _policy(PolicyType.ROW_FILTER, 'filter := true if session_user() == "carol" else := col("r") in ["EU"]'),
        _policy(PolicyType.COLUMN_MASK, _MASK),
        _policy(PolicyType.ROW_FILTER, "filter := x"),  # unparseable: fails for everyone, mentions nothing
    ]
    mentions = mentions_of(policies, ["dave"], ["entry-group"])
    assert mentions.users == {"carol", "dave"}, "EU is compared with a column: no user name is"
    assert mentions.groups == {"a", "entry-group"}
    # A user's name as a filter's value: a name equal to any literal (another filter's, say) may resolve apart.
    as_value = _policy(PolicyType.ROW_FILTER, 'filter := col("owner") == session_user()')
    assert mentions_of([*policies, as_value], [], []).users == {"carol", "EU"}


def test_one_reader_per_class_and_one_for_anyone_else() -> None:
    mentions = mentions_of([], ["carol"], ["a"])
    memberships = {
        "alice": frozenset({"a", "x"}),
        "bob": frozenset({"x"}),  # x is named nowhere: bob resolves as erin does
        "carol": frozenset(),  # named by an entry: her own class
        "erin": frozenset(),
        "frank": frozenset({"a"}),  # as alice
    }
    readers = reader_classes(memberships, frozenset({"a", "x"}), mentions)
    assert [(r.user, r.groups) for r in readers] == [
        ("alice", frozenset({"a", "x"})),
        ("bob", frozenset({"x"})),
        ("carol", frozenset()),
    ]
    assert all(r.known_groups == {"a", "x"} for r in readers)
    alone = reader_classes({"alice": frozenset({"a"})}, frozenset({"a"}), mentions)
    assert [(r.user, r.groups) for r in alone] == [
        ("alice", frozenset({"a"})),
        ("carol", frozenset()),
        ("", frozenset()),
    ]
