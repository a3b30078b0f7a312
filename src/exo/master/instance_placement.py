"""Turning a placement request into an instance: the nodes that are up, their free memory, the plan, and the
addresses the ranks meet at. Pure but for the ports, which the caller draws (so tests fix them)."""

from collections.abc import Callable
from contextlib import suppress

from exo.master.pipeline_placement import NodeCapacity, PipelinePlan, PlacementError, plan_pipeline
from exo.master.split_choice import choose_split, placement_reason
from exo.master.split_estimates import estimates_of
from exo.master.tensor_placement import plan_tensor
from exo.shared.apply import is_up
from exo.shared.types.common import InstanceId, NodeId
from exo.shared.types.footprint import ModelFootprint
from exo.shared.types.instances import PlacedInstance, PlaceInstance, RankPlacement
from exo.shared.types.state import State
from exo.shared.types.worker.shards import Parallelism, PipelinePeers

# Ring and task ports are drawn below Linux's ephemeral range (32768+), where outgoing connections take theirs.
PORT_RANGE = (20000, 32000)


def node_host(state: State, node_id: NodeId) -> str:
    """The IPv4 address other nodes reach `node_id` at (from its cluster endpoints)."""
    for endpoint in state.nodes[node_id].facts.cluster_endpoints:
        host = endpoint.removeprefix("tcp/").rsplit(":", 1)[0]
        if not host.startswith("["):
            return host
    raise PlacementError(f"node {node_id} has no IPv4 cluster address for the ring backend")


def place_instance(
    state: State,
    request: PlaceInstance,
    instance_id: InstanceId,
    *,
    now: float,
    draw_ports: Callable[[int], list[int]],
    excluded: frozenset[NodeId] = frozenset(),
) -> PlacedInstance:
    """The instance `request` asks for over the nodes up in `state` (but `excluded`); raises PlacementError naming
        the memory needed and available when it fits nowhere (IndivisibleHeadsError, a PlacementError, when a tensor
    split cannot divide the model's heads over the nodes asked for)."""
    capacities = up_capacities(state, excluded)
    if request.parallel == "auto":
        candidates = auto_candidates(request.model_id, request.footprint, capacities, request.min_nodes)
        choice = choose_split(
            "auto", request.footprint, estimates_of(state, request.footprint, candidates, request.model_id)
        )
        chosen = [
            plan
            for parallel, plan in candidates
            if parallel == choice.parallel and len(plan.node_ids) == (choice.world_size or len(plan.node_ids))
        ]
        plan = chosen[0]  # the candidates' first pipeline is the one `auto` takes without figures
    else:
        choice = choose_split(request.parallel, request.footprint)
        planner = plan_tensor if choice.parallel == "tensor" else plan_pipeline
        plan = planner(request.model_id, request.footprint, capacities, min_nodes=request.min_nodes)
    parallel = choice.parallel
    ranks: list[RankPlacement] = []
    planned_ranks = zip(plan.node_ids, plan.layer_counts, plan.planned_bytes, strict=True)
    for rank, (node_id, count, planned) in enumerate(planned_ranks):
        start = 0 if parallel == "tensor" else sum(plan.layer_counts[rank + 1 :])
        ranks.append(
            RankPlacement(rank=rank, node_id=node_id, start_layer=start, end_layer=start + count, planned_bytes=planned)
        )
    peers = None
    if len(ranks) > 1:
        ports = draw_ports(len(ranks) + 1)
        hosts = [node_host(state, placement.node_id) for placement in ranks]
        peers = PipelinePeers(
            ring_addresses=tuple(f"{host}:{port}" for host, port in zip(hosts, ports, strict=False)),
            task_address=f"{hosts[0]}:{ports[-1]}",
            layer_counts=plan.layer_counts,
            parallel=parallel,
        )
    return PlacedInstance(
        instance_id=instance_id,
        model_id=request.model_id,
        min_nodes=request.min_nodes,
        parallel=parallel,
        parallel_reason=placement_reason(choice, len(ranks)),
        parallel_asked=request.parallel,
        files_from=request.files_from,
        footprint=request.footprint,
        ranks=tuple(ranks),
        peers=peers,
        placed_at=now,
    )


def up_capacities(state: State, excluded: frozenset[NodeId] = frozenset()) -> list[NodeCapacity]:
    """What placement may use: each node up in `state` (but `excluded`) with its free memory."""
    return [
        NodeCapacity(
            node_id=node_id,
            available_bytes=node.facts.memory.available_bytes,
            weights=node.facts.weights_in_memory,
        )
        for node_id, node in sorted(state.nodes.items())
        if is_up(state, node_id) and node_id not in excluded
    ]


def auto_candidates(
    model: str, footprint: ModelFootprint, capacities: list[NodeCapacity], min_nodes: int
) -> list[tuple[Parallelism, PipelinePlan]]:
    """What `auto` weighs: the smallest pipeline (one node where one holds the model and `min_nodes` allows), a
    pipeline over two nodes or more beside one node, and the smallest tensor split over two or more whose heads
    divide. Raises the smallest pipeline's PlacementError when the model fits nowhere."""
    smallest = plan_pipeline(model, footprint, capacities, min_nodes=min_nodes)
    candidates: list[tuple[Parallelism, PipelinePlan]] = [("pipeline", smallest)]
    split_min = max(min_nodes, 2)
    if len(smallest.node_ids) == 1:
        with suppress(PlacementError):  # too few nodes
            candidates.append(("pipeline", plan_pipeline(model, footprint, capacities, min_nodes=split_min)))
    with suppress(PlacementError):  # too few nodes, or heads that so many nodes do not divide
        candidates.append(("tensor", plan_tensor(model, footprint, capacities, min_nodes=split_min)))
    return candidates


def same_split_asked(current: PlacedInstance, request: PlaceInstance) -> bool:
    """Whether `request` asks for the split `current` was placed with: `auto` again for an instance `auto` placed
    (whichever split it chose), or the split the instance has. An instance from before the request was kept
    counts as `auto`'s when it is a pipeline (the only split `auto` chose then)."""
    if request.parallel != "auto":
        return current.parallel == request.parallel
    if current.parallel_asked is None:
        return current.parallel == "pipeline"
    return current.parallel_asked == "auto"
