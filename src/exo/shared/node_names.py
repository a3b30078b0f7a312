"""Readable node names: the name a node reports (`--node-name`, else its host name), with a short id appended when
another node of the cluster reports the same name (two machines both called "vm" become "vm-3fa2c1", "vm-8d0e47")."""

from collections import Counter
from collections.abc import Mapping

from exo.shared.types.common import NodeId
from exo.shared.types.state import NodeInfo

SHORT_ID_LENGTH = 6


def display_names(nodes: Mapping[NodeId, NodeInfo]) -> dict[NodeId, str]:
    """Each node's name as the cluster shows it: unique among `nodes` (every known node, up or down)."""
    counts = Counter(node.facts.name for node in nodes.values())
    return {
        node_id: node.facts.name if counts[node.facts.name] == 1 else f"{node.facts.name}-{node_id[:SHORT_ID_LENGTH]}"
        for node_id, node in nodes.items()
    }


def shown_name(node: NodeInfo) -> str:
    """The node's display name (its own name in a state folded before display names existed)."""
    return node.display_name or node.facts.name
