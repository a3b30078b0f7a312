"""The host-overhead meter's totals: each decode step's time, split into waiting on the model and the host's own
work by part (`exo.worker.engines.mlx.step_clock` measures a step), summed by how many requests decoded in it.

A step in which nothing decoded (the runner idle, or only prefilling) is not a decode step and is left out. The
totals only grow, so `/metrics` exposes them as counters and a reader takes differences between two reads. The
runner hands them to its supervisor with each finished task (`TaskDone`).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from exo.shared.types.worker.runner_response import StepTimes
from exo.worker.engines.mlx.step_clock import STEP_CLOCK, StepPart

_NOT_HOST: Final[frozenset[StepPart]] = frozenset({"device", "prefill", "beside"})


@dataclass
class _Sums:
    """One stream count's running sums, added to in place every step (a `StepTimes` is built only when read)."""

    steps: int = 0
    step_seconds: float = 0.0
    device_seconds: float = 0.0
    prefill_seconds: float = 0.0
    beside_seconds: float = 0.0
    host_seconds: dict[str, float] = field(default_factory=dict[str, float])

    def add(self, wall: float, parts: Mapping[StepPart, float]) -> None:
        device = parts.get("device", 0.0)
        prefill = parts.get("prefill", 0.0)
        host = self.host_seconds
        spent = 0.0
        for name, seconds in parts.items():
            if name not in _NOT_HOST:
                host[name] = host.get(name, 0.0) + seconds
                spent += seconds
        host["loop"] = host.get("loop", 0.0) + max(0.0, wall - device - prefill - spent)
        self.steps += 1
        self.step_seconds += wall
        self.device_seconds += device
        self.prefill_seconds += prefill
        self.beside_seconds += parts.get("beside", 0.0)

    def times(self) -> StepTimes:
        return StepTimes(
            steps=self.steps,
            step_seconds=self.step_seconds,
            device_seconds=self.device_seconds,
            prefill_seconds=self.prefill_seconds,
            beside_seconds=self.beside_seconds,
            host_seconds=dict(self.host_seconds),
        )


class StepMeter:
    def __init__(self) -> None:
        self._sums: dict[int, _Sums] = {}

    def begin(self) -> None:
        STEP_CLOCK.begin()

    def end(self, streams: int) -> float:
        """Close the step begun last; `streams` requests decoded in it (0: not a decode step). Returns its wall
        time."""
        wall, parts = STEP_CLOCK.end()
        if streams > 0:
            sums = self._sums.get(streams)
            if sums is None:
                sums = self._sums[streams] = _Sums()
            sums.add(wall, parts)
        return wall

    @property
    def totals(self) -> dict[int, StepTimes]:
        """Decode-step times since the meter started, by requests decoding in the step."""
        return {streams: sums.times() for streams, sums in self._sums.items()}
