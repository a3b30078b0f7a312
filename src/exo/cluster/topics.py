"""The cluster's zenoh key space. Everything lives under `exo/<cluster>/v1/`, so two clusters (or two protocol
versions) on one network never see each other's messages."""

from dataclasses import dataclass

from exo.cluster.identity import is_node_id
from exo.shared.types.common import NodeId

PROTOCOL_VERSION = "v1"


@dataclass(frozen=True)
class Member:
    """One node session's liveliness token: a restarted node is the same node with a later `started_at_ms`."""

    node_id: NodeId
    started_at_ms: int


@dataclass(frozen=True)
class Topics:
    cluster: str

    @property
    def root(self) -> str:
        return f"exo/{self.cluster}/{PROTOCOL_VERSION}"

    @property
    def members(self) -> str:
        """Liveliness tokens of every node session."""
        return f"{self.root}/members/**"

    def member(self, member: Member) -> str:
        return f"{self.root}/members/{member.node_id}/{member.started_at_ms}"

    def parse_member(self, key: str) -> Member | None:
        """The member a liveliness key names, or None for a key that is not one of ours."""
        prefix = f"{self.root}/members/"
        if not key.startswith(prefix):
            return None
        parts = key.removeprefix(prefix).split("/")
        # A node id as exo draws them, and a start time in milliseconds that fits in 15 digits (year 33658).
        if len(parts) != 2 or not is_node_id(parts[0]) or not (parts[1].isdigit() and len(parts[1]) <= 15):
            return None
        return Member(node_id=NodeId(parts[0]), started_at_ms=int(parts[1]))

    def member_claim(self, node_id: NodeId) -> str:
        """The node answers queries here with the start time of its session (how its token is checked)."""
        return f"{self.root}/claims/{node_id}"

    def link_probe(self, node_id: NodeId) -> str:
        """The node answers queries here at once: peers time the round trip (cluster/link_probe.py)."""
        return f"{self.root}/probe/{node_id}"

    def link_probe_bulk(self, node_id: NodeId) -> str:
        """The node answers queries here at once with a large reply: peers time the link's bandwidth."""
        return f"{self.root}/probe-bulk/{node_id}"

    @property
    def local_events(self) -> str:
        """Nodes → master: reports to be ordered."""
        return f"{self.root}/events/local"

    @property
    def ordered_events(self) -> str:
        """Master → every node: the event log."""
        return f"{self.root}/events/ordered"

    @property
    def state(self) -> str:
        """The master answers queries here with its state snapshot."""
        return f"{self.root}/state"

    @property
    def resync(self) -> str:
        return f"{self.root}/resync"

    def master_commands(self, master: NodeId) -> str:
        """A node → the master it follows. Only that master hears it: a node that has just started is its own master
        until it has confirmed the others, and must not answer for the cluster with the nothing it knows yet."""
        return f"{self.root}/master/{master}/commands"

    def worker_commands(self, node_id: NodeId) -> str:
        return f"{self.root}/workers/{node_id}"

    def task_replies(self, node_id: NodeId) -> str:
        return f"{self.root}/replies/{node_id}"

    def instance_replies(self, node_id: NodeId) -> str:
        """Master → the node that asked for a placement: the instance placed, or why it fits nowhere."""
        return f"{self.root}/instances/{node_id}"
