"""What the placement tests build: an 8-layer model's footprint, a request to place it, the ports the master draws,
nodes with a given free memory, and one placement from them."""

from collections.abc import Mapping, Sequence

from exo.master.instance_placement import place_instance
from exo.shared.types.common import CommandId, InstanceId, ModelId, NodeId
from exo.shared.types.events import NodeReported
from exo.shared.types.footprint import ModelFootprint
from exo.shared.types.instances import PlacedInstance, PlaceInstance
from exo.shared.types.links import LinkMeasurement
from exo.shared.types.state import RunnerInfo, State
from exo.shared.types.worker.shards import ParallelChoice
from tests.shared.state_builders import NODE_A, facts, fold, reported

# 8 layers of 100 M parameters and 100 M shared (0.37 GiB each in float32); 8 heads, 2 KV heads, MLP width 4096,
# hidden size 2048.
FOOTPRINT = ModelFootprint(
    layer_parameters=(100_000_000,) * 8,
    shared_parameters=100_000_000,
    layer_file_bytes=(200_000_000,) * 8,
    shared_file_bytes=200_000_000,
    attention_heads=8,
    kv_heads=2,
    mlp_width=4096,
    hidden_size=2048,
)


def place_request(
    min_nodes: int, parallel: ParallelChoice = "auto", footprint: ModelFootprint = FOOTPRINT
) -> PlaceInstance:
    """NODE_A asks for model-x over at least `min_nodes` nodes, split as `parallel` says."""
    return PlaceInstance(
        request_id=CommandId("r1"),
        model_id=ModelId("model-x"),
        min_nodes=min_nodes,
        footprint=footprint,
        files_from=NODE_A,
        parallel=parallel,
    )


def draw_ports(count: int) -> list[int]:
    return list(range(21000, 21000 + count))


def nodes_free(*free_gib: tuple[NodeId, float]) -> State:
    """The state once each node reported this many GiB free."""
    return fold(*[(reported(node_id, available_gib=gib), node_id) for node_id, gib in free_gib])


def place(state: State, request: PlaceInstance) -> PlacedInstance:
    """The master's placement of `request` in `state` as instance i1."""
    return place_instance(state, request, InstanceId("i1"), now=5.0, draw_ports=draw_ports)


def nodes_measured(
    free_gib: float,
    *node_ids: NodeId,
    bandwidth_gb_s: float | None,
    round_trip_ms: float | None,
    link_mb_s: float | None = None,
    settling: bool = False,
    runners: Mapping[NodeId, Sequence[RunnerInfo]] | None = None,
) -> State:
    """The state once each node reported `free_gib` free, the memory bandwidth it measured (None: not yet) and the
    round trip to every other node (None: not yet measured) and the link bandwidth (None: not measured), those link
    figures `settling` (measured only just after a join) where asked, with each node's `runners`."""
    reports: list[tuple[NodeReported, NodeId]] = []
    for node_id in node_ids:
        links = {
            peer: LinkMeasurement(
                round_trip_ms=round_trip_ms,
                samples=5,
                measured_at=1.0,
                bandwidth_bytes_per_second=None if link_mb_s is None else link_mb_s * 1e6,
                settling=settling,
            )
            for peer in node_ids
            if peer != node_id and round_trip_ms is not None
        }
        measured = facts(node_id, available_gib=free_gib).model_copy(
            update={
                "links": links,
                "memory_bandwidth_bytes_per_second": None if bandwidth_gb_s is None else bandwidth_gb_s * 1e9,
            }
        )
        held = tuple((runners or {}).get(node_id, ()))
        reports.append((NodeReported(facts=measured, runners=held), node_id))
    return fold(*reports)
