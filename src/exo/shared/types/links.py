"""What a node measured about its links and itself, published in its facts for placement's `auto` rule."""

from exo.shared.types.common import FrozenModel


class LinkMeasurement(FrozenModel):
    """The round trip from the measuring node to one peer over the cluster's own transport (a zenoh query to the
    peer's probe and its reply), the median of `samples` tries."""

    round_trip_ms: float
    samples: int
    # The measuring node's clock (seconds since the epoch) when the tries ended.
    measured_at: float
