"""The cluster's HTTP endpoints: typed read views for agents and tools, Prometheus metrics, and the two writes
(add a peer, scan again). Every answer is a pydantic model, so the OpenAPI schema documents it."""

from typing import Any

from fastapi import APIRouter, Response

from exo.api.cluster_views import (
    cluster_metrics,
    cluster_node,
    cluster_nodes,
    cluster_summary,
    placed_instance_view,
)
from exo.api.errors import ApiError
from exo.api.prometheus import PROMETHEUS_CONTENT_TYPE, prometheus_text
from exo.cluster.settings import normalise_endpoint
from exo.master.client import MasterClient
from exo.shared.errors import (
    ClusterSettingsError,
    ExoModelError,
    InstancePlacementError,
    NoMasterError,
    PeerUnreachableError,
)
from exo.shared.types.api import ErrorResponse
from exo.shared.types.cluster_api import (
    ClusterMetrics,
    ClusterNode,
    ClusterNodeList,
    ClusterSummary,
    DiscoveryReport,
    InstanceList,
    InstanceRequest,
    PeerConnection,
    PeerRequest,
    PlacedInstanceView,
)
from exo.shared.types.common import NodeId


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        400: "Invalid request",
        401: "Missing or wrong API key",
        404: "No such node",
        500: "Server error",
        502: "The peer did not answer",
        503: "No cluster master answered",
    }
    return {status: {"model": ErrorResponse, "description": descriptions[status]} for status in statuses}


def cluster_router(master: MasterClient) -> APIRouter:
    router = APIRouter(tags=["cluster"])

    @router.get("/v1/cluster", responses=_errors(401, 500))
    async def summary() -> ClusterSummary:
        """Nodes up and down, memory, and which models run where."""
        return cluster_summary(master.state, master.cluster_name, master.node_id)

    @router.get("/v1/cluster/nodes", responses=_errors(401, 500))
    async def nodes() -> ClusterNodeList:
        """Every node the cluster has seen, with its facts and health (down nodes included)."""
        return ClusterNodeList(data=cluster_nodes(master.state))

    @router.get("/v1/cluster/nodes/{node_id}", responses=_errors(401, 404, 500))
    async def node(node_id: str) -> ClusterNode:
        """One node's facts, health and runners."""
        state = master.state
        info = state.nodes.get(NodeId(node_id))
        if info is None:
            raise ApiError(404, f"no node {node_id!r} in this cluster", error_type="not_found_error", param="node_id")
        return cluster_node(state, info)

    @router.get("/v1/cluster/metrics", responses=_errors(401, 500))
    async def metrics() -> ClusterMetrics:
        """Per node and per model: requests, tokens, time to first token, decode speed, queue depth, memory."""
        return cluster_metrics(master.state)

    @router.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}, "description": "Prometheus text format"}},
    )
    async def prometheus() -> Response:
        """The same figures for Prometheus, labelled by node, model and runner."""
        return Response(prometheus_text(master.state, master.cluster_name), media_type=PROMETHEUS_CONTENT_TYPE)

    @router.post("/v1/cluster/peers", responses=_errors(400, 401, 500, 502))
    async def add_peer(request: PeerRequest) -> PeerConnection:
        """Connect to another node at runtime (`tcp/HOST:PORT`); `joined` says whether it is in this cluster."""
        try:
            endpoint = normalise_endpoint(request.endpoint)
        except ClusterSettingsError as error:
            raise ApiError(400, str(error), param="endpoint", code="invalid_endpoint") from error
        try:
            return await master.add_peer(endpoint)
        except PeerUnreachableError as error:
            raise ApiError(502, str(error), error_type="server_error", code="peer_unreachable") from error

    @router.get("/v1/cluster/instances", responses=_errors(401, 500))
    async def instances() -> InstanceList:
        """Models placed over nodes by memory: each rank's node, layers and runner."""
        state = master.state
        views = [placed_instance_view(state, instance) for instance in state.instances.values()]
        unplaced = sorted(state.pending_placements.values(), key=lambda pending: pending.model_id)
        return InstanceList(data=sorted(views, key=lambda view: (view.model_id, view.instance_id)), unplaced=unplaced)

    @router.post("/v1/cluster/instances", responses=_errors(400, 401, 500, 503))
    async def place(request: InstanceRequest) -> PlacedInstanceView:
        """Place a model over at least `min_nodes` nodes (the smallest set whose free memory holds it; by layers in
        proportion to free memory, or by matrices with `parallel: tensor`) and keep it placed as nodes come and go."""
        try:
            instance = await master.place_instance(request.model, request.min_nodes, request.parallel)
        except InstancePlacementError as error:
            param = "parallel" if error.code == "indivisible_heads" else "min_nodes"
            raise ApiError(400, str(error), param=param, code=error.code) from error
        except NoMasterError as error:
            raise ApiError(503, str(error), error_type="server_error", code="no_master") from error
        except (ExoModelError, OSError, ValueError) as error:
            raise ApiError(400, f"cannot prepare model {request.model!r}: {error}", param="model") from error
        return placed_instance_view(master.state, instance)

    @router.post("/v1/cluster/discover", responses=_errors(401, 500))
    async def discover() -> DiscoveryReport:
        """Scan the network for nodes once (multicast scouting) and connect to those not connected yet."""
        return await master.discover()

    return router
