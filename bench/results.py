"""Typed results of every benchmark section: what the report and the charts are rendered from."""

from pydantic import BaseModel, ConfigDict


class BenchModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StreamMeasurement(BenchModel):
    """One streamed completion, timed on the client side (or in-process for the raw baseline)."""

    ttft_s: float
    """Request sent → first generated text (content, reasoning or tool call) arrived."""
    total_s: float
    """Request sent → stream finished."""
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int
    text: str

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first one over the time after the first one: decode speed without prefill.

        None when there is nothing to time: fewer than two tokens, or a server that sent the whole answer at once.
        """
        decode_time = self.total_s - self.ttft_s
        if self.completion_tokens < 2 or decode_time <= 0:
            return None
        return (self.completion_tokens - 1) / decode_time


class DecodeRow(BenchModel):
    """Best-of-N decode measurement of one system."""

    system: str
    ttft_s: float
    decode_tokens_per_s: float | None
    completion_tokens: int
    prompt_tokens: int


class AgentTurn(BenchModel):
    turn: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float


class AgentSeries(BenchModel):
    system: str
    turns: list[AgentTurn]


class ParserCost(BenchModel):
    argument_bytes: int
    segments: int
    microseconds_per_segment: float
    chars_examined_per_char: float
    """The parser's work meter over the call's length: flat across sizes means linear work, whatever the timing."""


class ConcurrencyRow(BenchModel):
    streams: int
    aggregate_tokens_per_s: float
    per_stream_tokens_per_s: float
    mean_ttft_s: float


class MachineInfo(BenchModel):
    platform: str
    python: str
    cpu_count: int
    load_average: tuple[float, float, float]
    mlx_version: str
    mlx_lm_version: str
    blas: str
    matmul_gflops: float
    exo_commit: str


class BenchSettings(BenchModel):
    """The knobs of one run; `--quick` picks small values so the smoke run finishes in well under a minute."""

    quick: bool
    decode_max_tokens: int
    decode_repeats: int
    agent_system_chars: int
    agent_tool_count: int
    agent_turns: int
    agent_max_tokens: int
    parser_sizes: tuple[int, ...]
    parser_segment_chars: int
    parser_repeats: int
    concurrency_levels: tuple[int, ...]
    concurrency_max_tokens: int


class BenchReport(BenchModel):
    model_id: str
    model_path: str
    settings: BenchSettings
    machine: MachineInfo
    decode: list[DecodeRow]
    agent: list[AgentSeries]
    parser: list[ParserCost]
    concurrency: list[ConcurrencyRow]
    wall_s: float
