"""The host-overhead meter's totals: each decode step's time, split into waiting on the model and the host's own
work by part (`exo.worker.engines.mlx.step_clock` measures a step), summed by how many requests decoded in it.

A step in which nothing decoded (the runner idle, or only prefilling) is not a decode step and is left out. The
totals only grow, so `/metrics` exposes them as counters and a reader takes differences between two reads. The
runner hands them to its supervisor with each finished task (`TaskDone`).
"""

from collections.abc import Mapping
from typing import Final

from exo.shared.types.worker.runner_response import StepTimes
from exo.worker.engines.mlx.step_clock import STEP_CLOCK, StepPart

_NOT_HOST: Final[frozenset[StepPart]] = frozenset({"device", "prefill"})


class StepMeter:
    def __init__(self) -> None:
        self._totals: dict[int, StepTimes] = {}

    def begin(self) -> None:
        STEP_CLOCK.begin()

    def end(self, streams: int) -> float:
        """Close the step begun last; `streams` requests decoded in it (0: not a decode step). Returns its wall
        time."""
        wall, parts = STEP_CLOCK.end()
        if streams > 0:
            self._totals[streams] = _added(self._totals.get(streams, StepTimes()), wall, parts)
        return wall

    @property
    def totals(self) -> dict[int, StepTimes]:
        """Decode-step times since the meter started, by requests decoding in the step."""
        return dict(self._totals)


def _added(totals: StepTimes, wall: float, parts: Mapping[StepPart, float]) -> StepTimes:
    device = parts.get("device", 0.0)
    prefill = parts.get("prefill", 0.0)
    host = {name: seconds for name, seconds in parts.items() if name not in _NOT_HOST}
    host["loop"] = max(0.0, wall - device - prefill - sum(host.values()))
    merged = dict(totals.host_seconds)
    for name, seconds in host.items():
        merged[name] = merged.get(name, 0.0) + seconds
    return StepTimes(
        steps=totals.steps + 1,
        step_seconds=totals.step_seconds + wall,
        device_seconds=totals.device_seconds + device,
        prefill_seconds=totals.prefill_seconds + prefill,
        host_seconds=merged,
    )
