"""A model the cluster knows but cannot serve right now: a 503 `model_unavailable` with Retry-After and the reason
(a node left and it is being placed again, too few nodes up, not enough memory), never a 404."""

from exo.api.errors import UNAVAILABLE_RETRY_AFTER_SECONDS, ApiError
from exo.shared.apply import is_up
from exo.shared.types.common import ModelId
from exo.shared.types.state import State


def unavailable_error(state: State, model: str) -> ApiError | None:
    """The 503 for `model` if the cluster keeps it placed but it has no instance now; None otherwise."""
    pending = state.pending_placements.get(ModelId(model))
    if pending is None:
        return None
    up = sum(is_up(state, node_id) for node_id in state.nodes)
    return ApiError(
        503,
        f"model '{model}' is unavailable: {pending.reason} (nodes up: {up}; asked for: {pending.min_nodes})",
        error_type="server_error",
        param="model",
        code="model_unavailable",
        headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)},
    )
