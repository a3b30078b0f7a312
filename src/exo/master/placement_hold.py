"""Holding an `auto` placement a moment for the figures it weighs (docs/CLUSTER.md, "Which split `auto` picks").

A model placed at start with `--min-nodes 2` is asked for the moment the second node is up, before the round trip
between the two (each node probes a peer as it joins, cluster/link_probe.py) or the newcomer's memory bandwidth has
reached the master: placed then, `auto` could only split by layers. So the master holds an `auto` placement that
would go over more than one node while the figures its candidates lack belong to a node that joined less than
AUTO_FIGURES_GRACE_SECONDS ago, and places it as soon as they arrive or the grace ends (then by layers, as without
figures). A link figure measured only in the busy moments of a join (`settling`, cluster/link_probe.py) counts as
not there yet: two nodes on one loaded machine measured a 15 ms round trip and 12 MB/s at join, where a second later
they measured 0.3-0.4 ms and 500-1,000 MB/s, enough to weigh the splits wrongly; where the grace ends first, the
settling figure is weighed. A split asked for, and a placement on one node, are never held; nor is a request held
longer than the grace, whatever joins meanwhile.
"""

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Final

from exo.master.instance_placement import auto_candidates, up_capacities
from exo.master.pipeline_placement import PlacementError
from exo.master.split_estimates import estimates_of, settling_nodes
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.instances import PlaceInstance
from exo.shared.types.state import State

logger = logging.getLogger(__name__)

AUTO_FIGURES_GRACE_SECONDS: Final = 8.0
"""Why 8 s: a node probes a peer the moment it joins and publishes the figure as soon as it has it (a healthy link
answers the probe's five queries in well under a second; the memory bandwidth takes a tenth of a second at start).
A joined peer's figures settle 3 s after its first round (link_probe.SETTLE_ROUNDS_SECONDS). 8 s leaves room for a
probe that loses a few queries or a report that is lost (the next comes 5 s later) and is
short beside loading a model, for someone waiting on the placement request."""


def awaited_nodes(state: State, request: PlaceInstance) -> frozenset[NodeId]:
    """The nodes whose figures `auto` lacks to weigh the splits of `request`, where without them it would split by
    layers over more than one node, or whose link figures are still settling after a join (none: nothing to wait
    for)."""
    if request.parallel != "auto":
        return frozenset()
    try:
        candidates = auto_candidates(request.model_id, request.footprint, up_capacities(state), request.min_nodes)
    except PlacementError:
        return frozenset()  # refused at once, as it always was
    if len(candidates[0][1].node_ids) == 1:
        return frozenset()  # without figures it goes on one node: never held
    estimates = estimates_of(state, request.footprint, candidates, request.model_id)
    awaited: set[NodeId] = set()
    for (_parallel, plan), estimate in zip(candidates, estimates, strict=True):
        awaited |= set(plan.node_ids) if estimate.total_ms is None else settling_nodes(state, plan.node_ids)
    return frozenset(awaited)


class HeldPlacements:
    """The `auto` placements the master holds for their figures, and when each node joined (on `clock`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._joined_at: dict[NodeId, float] = {}
        # Each held request and when it was first held.
        self._held: dict[CommandId, tuple[PlaceInstance, float]] = {}

    def joined(self, nodes: Iterable[NodeId]) -> None:
        now = self._clock()
        self._joined_at.update(dict.fromkeys(nodes, now))

    def hold(self, state: State, request: PlaceInstance, held_since: float | None = None) -> bool:
        """Whether to hold `request` (first held at `held_since`) for figures on their way; a held request is handed
        back by `take`, to be placed or held again."""
        now = self._clock()
        since = now if held_since is None else held_since
        awaited = awaited_nodes(state, request)
        newest = max((self._joined_at.get(node, -math.inf) for node in awaited), default=-math.inf)
        if now >= min(newest, since) + AUTO_FIGURES_GRACE_SECONDS:
            return False
        if held_since is None:
            logger.info(
                "holding the placement of %s up to %.0f s for the figures auto weighs (from %s)",
                request.model_id,
                AUTO_FIGURES_GRACE_SECONDS,
                ", ".join(sorted(awaited)),
            )
        self._held[request.request_id] = (request, since)
        return True

    def take(self) -> list[tuple[PlaceInstance, float]]:
        """Every held request with when it was first held (no longer held until `hold` says so again)."""
        held = list(self._held.values())
        self._held.clear()
        return held

    def clear(self) -> None:
        self._held.clear()
