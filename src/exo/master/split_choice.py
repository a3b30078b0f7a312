"""Which split a placement gets, and why: the `auto` rule (docs/CLUSTER.md, "Which split `auto` picks").

Each token of a tensor split waits for two all-sums per layer over the link and the chosen token (2L + 1
exchanges), a pipeline's for about three whatever its depth (1.4 and 3.3 ms/token per added ms of round trip in
two runs on the rig); a tensor split saves compute (each rank reads 1/N of every layer), which pays only where that
saving is larger than the 2L - 2 extra exchanges. So `auto` weighs each candidate — one node (when it holds the
model and `min_nodes` allows), a pipeline and a tensor split over the nodes placement would choose — by its
estimated time per token: its compute (the bytes its ranks read per token over each node's measured memory
bandwidth) plus its exchanges times the slowest measured round trip between its nodes plus the bytes it sends per
token (a tensor split's all-sums, a pipeline's hidden state per hop) over the slowest measured bandwidth between
them, and takes the least. Where a link's bandwidth is not measured, its transfer is not counted (the reason says
so), as before bandwidth was measured. A
candidate whose figures are not all measured yet (a node just joined) leaves the rule without its figures: `auto`
then splits by layers as it did before the cluster measured anything, and says which figure it lacked.
"""

from collections.abc import Sequence
from typing import Final

from exo.shared.types.common import FrozenModel
from exo.shared.types.footprint import ModelFootprint
from exo.shared.types.worker.shards import ParallelChoice, Parallelism

PIPELINE_ROUND_TRIPS_PER_TOKEN: Final = 3
"""What a pipeline token waits for on the link whatever its depth: the hidden state, the chosen token, the batch."""


ACTIVATION_BYTES: Final = 4
"""Bytes of one hidden-state value on the link: float32, as a Linux CPU's engine computes (a checkpoint run in
bfloat16 sends half; counting 4 overstates its transfer)."""

STEP_MESSAGE_BYTES: Final = 256
"""About what rank 0's step message to each other rank takes per token of one row (a JSON batch step naming the
task, its cached length and the token fed)."""


def tensor_transfer_bytes(num_layers: int, hidden_size: int, world_size: int) -> int:
    """Bytes a rank of a tensor split sends per token of one row: two all-sums of the hidden state per layer, of
    which a ring all-sum over N ranks moves 2(N - 1)/N through each rank, and rank 0's step message to each other
    rank."""
    all_sums = 2 * num_layers * hidden_size * ACTIVATION_BYTES
    return all_sums * 2 * (world_size - 1) // world_size + (world_size - 1) * STEP_MESSAGE_BYTES


def pipeline_transfer_bytes(hidden_size: int, world_size: int) -> int:
    """Bytes a pipeline sends per token of one row: the hidden state over each of its N - 1 hops, and rank 0's
    step message to each other rank."""
    return (world_size - 1) * (hidden_size * ACTIVATION_BYTES + STEP_MESSAGE_BYTES)


def tensor_round_trips_per_token(num_layers: int) -> int:
    """Two all-sums per layer (after attention and after the MLP) and rank 0's step message (the token each row
    feeds): a lower bound on what a token of a tensor split waits for on the link."""
    return 2 * num_layers + 1


class SplitEstimate(FrozenModel):
    """One candidate for `auto`: a split over `world_size` nodes and its estimated time per token."""

    parallel: Parallelism
    world_size: int
    # Bytes read per token over memory bandwidth (or a decode step timed on the node, scaled by the rank's share of
    # the weights), summed along the pipeline's ranks or the slowest tensor rank.
    compute_ms: float | None
    # The ranks whose compute is a timed decode step rather than bytes over memory bandwidth.
    timed_ranks: int = 0
    # What the other ranks' bytes over memory bandwidth were multiplied by: how many times that estimate the steps
    # timed on other nodes took (None where no node timed one).
    untimed_scale: float | None = None
    # Exchanges a token waits for on the link (0 on one node).
    exchanges: int
    # The slowest measured round trip between the candidate's nodes (0 on one node).
    round_trip_ms: float | None
    # Bytes per token of one row on the link (0 on one node; None where the model's hidden size is unknown).
    transfer_bytes: int | None = 0
    # The slowest measured bandwidth between the candidate's nodes (None where a pair has no figure: transfer is
    # then not counted, as before links' bandwidth was measured).
    bandwidth_bytes_per_second: float | None = None
    # The figures not measured yet (none when every one was).
    missing: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        if self.world_size == 1:
            return "one node"
        return f"{'tensor' if self.parallel == 'tensor' else 'pipeline'} over {self.world_size} nodes"

    @property
    def total_ms(self) -> float | None:
        if self.compute_ms is None or self.round_trip_ms is None:
            return None
        return self.compute_ms + self.exchanges * self.round_trip_ms + (self.transfer_ms or 0.0)

    @property
    def transfer_ms(self) -> float | None:
        """The bytes per token over the bandwidth (None where either is unknown: not counted)."""
        if self.world_size == 1:
            return 0.0
        if self.transfer_bytes is None or not self.bandwidth_bytes_per_second:
            return None
        return 1000 * self.transfer_bytes / self.bandwidth_bytes_per_second

    def describe(self) -> str:
        total, compute = self.total_ms, self.compute_ms
        assert total is not None, "described only once measured"
        assert compute is not None, "described only once measured"
        if self.world_size == 1:
            return f"{self.label} est. {format_ms(total)} ms/token ({self._compute_term(compute)}, no link)"
        return (
            f"{self.label} est. {format_ms(total)} ms/token ({self._compute_term(compute)} + {self.exchanges} × "
            f"{format_ms(self.round_trip_ms or 0.0)} ms round trip{self._transfer_term()})"
        )

    def _compute_term(self, compute: float) -> str:
        """The compute, and where it is a decode step timed on the nodes rather than bytes over memory bandwidth,
        that it is."""
        if self.timed_ranks == self.world_size:
            return f"compute {format_ms(compute)} from a timed decode step"
        if self.untimed_scale is None:
            return f"compute {format_ms(compute)}"
        return (
            f"compute {format_ms(compute)} ({self.timed_ranks} of {self.world_size} ranks from a timed decode step, "
            f"the rest bytes over memory bandwidth × {self.untimed_scale:.3g} as timed)"
        )

    def _transfer_term(self) -> str:
        transfer = self.transfer_ms
        if self.transfer_bytes is None:
            return "; transfer not counted: the model's hidden size is unknown"
        size = f"{self.transfer_bytes / 1024:.1f} KiB"
        if transfer is None:
            return f"; transfer of {size} not counted: link bandwidth not measured"
        rate = format_rate(self.bandwidth_bytes_per_second or 0.0)
        return f" + {size} at {rate} = {format_ms(transfer)} ms transfer"


class SplitChoice(FrozenModel):
    parallel: Parallelism
    # Why: "asked for", or the `auto` rule's reason, with the figures for this model.
    reason: str
    # The number of nodes `auto` chose (None: the planner's smallest, as for a split asked for).
    world_size: int | None = None


def choose_split(
    choice: ParallelChoice, footprint: ModelFootprint, estimates: Sequence[SplitEstimate] = ()
) -> SplitChoice:
    """The split a request for `choice` gets, from the candidates' `estimates` (placement measures them)."""
    if choice != "auto":
        return SplitChoice(parallel=choice, reason=f"{choice} asked for")
    missing = [estimate for estimate in estimates if estimate.total_ms is None]
    split = [estimate for estimate in estimates if estimate.world_size > 1]
    if missing or not split:
        return _unmeasured(footprint, missing)
    best = min(estimates, key=lambda estimate: (estimate.total_ms or 0.0, estimate.world_size, estimate.parallel))
    others = [estimate.describe() for estimate in estimates if estimate is not best]
    return SplitChoice(
        parallel=best.parallel,
        world_size=best.world_size,
        reason=f"auto: {best.describe()}" + (f" against {'; '.join(others)}" if others else ""),
    )


def _unmeasured(footprint: ModelFootprint, missing: Sequence[SplitEstimate]) -> SplitChoice:
    """Before the cluster measured what the rule weighs: by layers, as `auto` always did."""
    tensor_trips = tensor_round_trips_per_token(footprint.num_layers)
    lacking = "; ".join(dict.fromkeys(figure for estimate in missing for figure in estimate.missing))
    why = f"not measured yet: {lacking}" if lacking else "no split to weigh against"
    return SplitChoice(
        parallel="pipeline",
        reason=(
            f"auto: by layers ({why}); split by matrices, this model's {footprint.num_layers} layers would wait for "
            f"{tensor_trips} round trips per token on the link against the pipeline's "
            f"{PIPELINE_ROUND_TRIPS_PER_TOKEN}"
        ),
    )


def placement_reason(choice: SplitChoice, world_size: int) -> str:
    """The reason an instance over `world_size` nodes shows for its split (one node: no split at all)."""
    if world_size > 1 or choice.world_size == 1:
        return choice.reason
    return f"on one node, which holds the whole model: nothing to split ({choice.reason})"


def format_ms(value: float) -> str:
    """Milliseconds as the reason shows them: one decimal from 1 ms, else three or four (a fast link's round trip
    and a small model's compute are fractions of one)."""
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.3f}" if value >= 0.01 else f"{value:.4f}"


def format_rate(bytes_per_second: float) -> str:
    """A link's bandwidth as the reason shows it: MB/s, whole from 10 (a slow link's keeps two decimals)."""
    megabytes = bytes_per_second / 1e6
    return f"{megabytes:.0f} MB/s" if megabytes >= 10 else f"{megabytes:.2f} MB/s"
