"""What a node measured about its links and itself, published in its facts for placement's `auto` rule."""

from exo.shared.types.common import FrozenModel


class LinkMeasurement(FrozenModel):
    """The round trip from the measuring node to one peer over the cluster's own transport (a zenoh query to the
    peer's probe and its reply), the median of `samples` tries, and the bandwidth from the peer to this node."""

    round_trip_ms: float
    samples: int
    # The measuring node's clock (seconds since the epoch) when the tries ended.
    measured_at: float
    # Bytes a second from the peer to this node: the extra bytes of a large probe reply over its extra time against
    # the small one (cluster/link_probe.py). None until measured, where the peer did not answer the large probe,
    # and in facts from a node that does not measure it.
    bandwidth_bytes_per_second: float | None = None
    # Measured only in the moments after the peer joined, when both nodes are busy with the join (its messages, a
    # starting node's API): the best of the rounds so far, with another round due within seconds
    # (cluster/link_probe.py SETTLE_ROUNDS_SECONDS). An `auto` placement waits for the settled figure
    # (master/placement_hold.py).
    settling: bool = False
