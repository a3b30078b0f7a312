"""exo_place_model: place a model over the cluster's nodes, split by layers or by matrices, as the placement API does.

The tool sends `POST /v1/cluster/instances` with the same three fields (model, min_nodes, parallel), so the node's
own rules answer: which split `auto` picks and why, the memory refusal, the indivisible head counts.
"""

from rich.filesize import decimal

from exo.mcp.node_client import NodeClient
from exo.shared.types.cluster_api import InstanceRequest, PlacedInstanceView
from exo.shared.types.worker.shards import ParallelChoice


def describe_placement(instance: PlacedInstanceView) -> str:
    """The instance, its split and why, and each rank's node, layers and planned memory."""
    state = "serving" if instance.ready else "starting (its runners load; exo_cluster_info shows when it serves)"
    lines = [
        f"{instance.model_id}: instance {instance.instance_id} over {instance.world_size} node(s), split by "
        f"{'matrices (tensor)' if instance.parallel == 'tensor' else 'layers (pipeline)'}; {state}.",
        f"Why this split: {instance.parallel_reason or 'not recorded'}.",
    ]
    if instance.degraded:
        lines.append(f"Degraded: {instance.degraded_reason or 'fewer nodes than asked for'}.")
    lines += [
        f"- rank {rank.rank} on {rank.node_name} [{rank.node_id}]: layers {rank.start_layer}-{rank.end_layer - 1}, "
        f"{decimal(rank.planned_bytes)} planned"
        for rank in instance.ranks
    ]
    return "\n".join(lines)


async def place_model(client: NodeClient, model: str, min_nodes: int, parallel: ParallelChoice) -> PlacedInstanceView:
    """POST /v1/cluster/instances; the node's refusals (memory, head counts, an unknown model) are NodeApiErrors."""
    return await client.place_instance(InstanceRequest(model=model, min_nodes=min_nodes, parallel=parallel))
