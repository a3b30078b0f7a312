"""Per-runner request counters and latency means, measured where the task runs."""

from collections import deque
from dataclasses import dataclass, field
from statistics import fmean

from exo.shared.types.chunks import Usage
from exo.shared.types.state import RunnerMetrics, TaskOutcome

# Means cover the most recent requests, so the figures follow a runner whose load changes.
RECENT_REQUESTS = 32


@dataclass
class RunnerMetricsRecorder:
    _metrics: RunnerMetrics = field(default_factory=RunnerMetrics)
    _first_token_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))
    _decode_rates: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))

    @property
    def metrics(self) -> RunnerMetrics:
        return self._metrics

    def record(
        self,
        outcome: TaskOutcome,
        *,
        first_token_seconds: float | None,
        decode_seconds: float | None,
        usage: Usage | None,
    ) -> None:
        """Count one task that left the runner; timings are None when it produced no chunk."""
        if first_token_seconds is not None:
            self._first_token_seconds.append(first_token_seconds)
        if usage is not None and decode_seconds is not None and decode_seconds > 0 and usage.completion_tokens > 1:
            # The first token came with the first chunk; the rest were decoded after it.
            self._decode_rates.append((usage.completion_tokens - 1) / decode_seconds)
        metrics = self._metrics
        self._metrics = RunnerMetrics(
            requests_finished=metrics.requests_finished + (outcome == "finished"),
            requests_failed=metrics.requests_failed + (outcome == "failed"),
            requests_cancelled=metrics.requests_cancelled + (outcome == "cancelled"),
            prompt_tokens=metrics.prompt_tokens + (usage.prompt_tokens if usage else 0),
            generated_tokens=metrics.generated_tokens + (usage.completion_tokens if usage else 0),
            time_to_first_token_seconds=fmean(self._first_token_seconds) if self._first_token_seconds else None,
            decode_tokens_per_second=fmean(self._decode_rates) if self._decode_rates else None,
            repeated_tool_calls=metrics.repeated_tool_calls + (usage.repeated_tool_calls if usage else 0),
            withdrawn_tool_calls=metrics.withdrawn_tool_calls + (usage.withdrawn_tool_calls if usage else 0),
        )
