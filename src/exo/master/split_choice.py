"""Which split a placement gets, and why: the `auto` rule (docs/CLUSTER.md, "Which split `auto` picks").

Each token of a tensor split waits for two all-sums per layer over the link and the chosen token (2L + 1
exchanges), a pipeline's for about three whatever its depth (1.4 and 3.3 ms/token per added ms of round trip in
two runs on the rig); a tensor split saves compute (each rank does 1/N of every layer), which pays only where that
saving is larger than the 2L - 2 extra exchanges. Measured on the rig with the test model (docs/PERFORMANCE.md,
"Tensor against pipeline against one node over a slow link"), the tensor split was slower than the pipeline at
every added round trip, +0 included, and one node faster than both. The cluster measures neither its links' round
trip nor a node's compute per token, so `auto` does not bet on tensor: it splits by layers (and a model one node
holds, with `min_nodes` 1, goes on one node). `parallel: "tensor"` asks for the matrix split.
"""

from typing import Final

from exo.shared.types.common import FrozenModel
from exo.shared.types.footprint import ModelFootprint
from exo.shared.types.worker.shards import ParallelChoice, Parallelism

PIPELINE_ROUND_TRIPS_PER_TOKEN: Final = 3
"""What a pipeline token waits for on the link whatever its depth: the hidden state, the chosen token, the batch."""


def tensor_round_trips_per_token(num_layers: int) -> int:
    """Two all-sums per layer (after attention and after the MLP) and rank 0's step message (the token each row
    feeds): a lower bound on what a token of a tensor split waits for on the link."""
    return 2 * num_layers + 1


class SplitChoice(FrozenModel):
    parallel: Parallelism
    # Why: "asked for", or the `auto` rule's reason, with the figures for this model.
    reason: str


def choose_split(choice: ParallelChoice, footprint: ModelFootprint) -> SplitChoice:
    """The split a request for `choice` gets (before the nodes are chosen)."""
    if choice != "auto":
        return SplitChoice(parallel=choice, reason=f"{choice} asked for")
    tensor_trips = tensor_round_trips_per_token(footprint.num_layers)
    return SplitChoice(
        parallel="pipeline",
        reason=(
            f"auto: by layers; split by matrices, this model's {footprint.num_layers} layers would wait for "
            f"{tensor_trips} round trips per token on the link against the pipeline's "
            f"{PIPELINE_ROUND_TRIPS_PER_TOKEN}, and the cluster does not measure its links to know that they pay"
        ),
    )


def placement_reason(choice: SplitChoice, world_size: int) -> str:
    """The reason an instance over `world_size` nodes shows for its split (one node: no split at all)."""
    if world_size > 1:
        return choice.reason
    return f"on one node, which holds the whole model: nothing to split ({choice.reason})"
