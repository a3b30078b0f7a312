"""Election and liveliness keys: pure rules every node applies to the tokens it sees."""

from exo.cluster.membership import MembershipView, elect_master
from exo.cluster.topics import Member, Topics
from exo.shared.types.common import NodeId

A, B, C = NodeId("a" * 32), NodeId("b" * 32), NodeId("c" * 32)


def test_the_longest_running_session_is_master_whatever_its_id() -> None:
    assert elect_master([Member(A, 300), Member(B, 100), Member(C, 200)]) == B
    assert elect_master([]) is None


def test_equal_start_times_are_broken_by_the_smaller_id() -> None:
    assert elect_master([Member(C, 100), Member(A, 100)]) == A


def test_a_joining_or_restarted_node_does_not_displace_the_master() -> None:
    sitting = MembershipView(frozenset({Member(A, 100), Member(B, 200)}))
    assert sitting.master == A
    # C joins; B restarts (a new session of the same node, later start) while its old token is still draining.
    assert MembershipView(sitting.members | {Member(C, 300), Member(B, 400)}).master == A
    assert MembershipView(sitting.members - {Member(A, 100)}).master == B


def test_a_node_with_two_sessions_counts_once_and_stays_live_until_both_go() -> None:
    view = MembershipView(frozenset({Member(A, 100), Member(A, 500), Member(B, 200)}))
    assert view.live_nodes == {A, B}
    assert MembershipView(view.members - {Member(A, 100)}).live_nodes == {A, B}


def test_member_keys_round_trip_and_foreign_keys_are_rejected() -> None:
    topics = Topics("lab")
    member = Member(A, 1_700_000_000_123)
    key = topics.member(member)
    assert key == f"exo/lab/v1/members/{A}/1700000000123"
    assert topics.parse_member(key) == member
    for foreign in (
        f"exo/other/v1/members/{A}/1",
        f"exo/lab/v2/members/{A}/1",
        f"exo/lab/v1/members/{A}",
        f"exo/lab/v1/members/{A}/soon",
        f"exo/lab/v1/members/{A}/1/extra",
        "exo/lab/v1/members//1",
        f"exo/lab/v1/members/{'c' * 200}/1",  # not a node id exo draws
        f"exo/lab/v1/members/{'0' + A[1:]}/1",
        f"exo/lab/v1/members/{A.upper()}/1",
        f"exo/lab/v1/members/{A}/{'9' * 16}",
    ):
        assert topics.parse_member(foreign) is None, foreign


def test_two_cluster_names_share_no_key() -> None:
    first, second = Topics("first"), Topics("second")
    keys = ("local_events", "ordered_events", "state", "resync", "members")
    for name in keys:
        assert getattr(first, name) != getattr(second, name)
        assert not getattr(first, name).startswith(second.root)
    for method in ("master_commands", "worker_commands", "task_replies", "instance_replies"):
        assert getattr(first, method)(A) != getattr(second, method)(A)
        assert not getattr(first, method)(A).startswith(second.root)


def test_a_distrusted_master_is_passed_over_but_stays_a_member() -> None:
    view = MembershipView(frozenset({Member(A, 100), Member(B, 200)}), distrusted=frozenset({A}))
    assert view.master == B
    assert view.live_nodes == {A, B}
