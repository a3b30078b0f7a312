"""Typed results of every benchmark section: what the report and the charts are rendered from."""

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict


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


RAW = "stock mlx-lm: mlx_lm.stream_generate"
"""The raw baseline: stock mlx-lm on the float32 weights, in a process that never imported exo's engine."""
RAW_REPLACED = "mlx-lm with exo's replacements: mlx_lm.stream_generate"
"""The same loop on the model as exo's `load_model` leaves it (its CPU replacements re-pointed into mlx-lm)."""
LEGACY_RAW = "raw mlx_lm.stream_generate"
"""What reports saved before the stock baseline called their raw row: it was loaded through exo's `load_model`, so
it is read as RAW_REPLACED."""


class DecodeRow(BenchModel):
    """Best-of-N decode measurement of one system."""

    system: Annotated[str, AfterValidator(lambda system: RAW_REPLACED if system == LEGACY_RAW else system)]
    ttft_s: float
    decode_tokens_per_s: float | None
    completion_tokens: int
    prompt_tokens: int
    runs: list[float | None] = []
    """Decode tokens/s of every run in run order (rounds of all systems), for paired comparisons."""


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
    """Characters the parser's scanners examined over the call's length: flat across sizes means linear work,
    whatever the timing."""


class ConcurrencyRow(BenchModel):
    """N streams started at once on one server; the figures are means over the repeats."""

    streams: int
    aggregate_tokens_per_s: float
    per_stream_tokens_per_s: float
    mean_ttft_s: float
    system: str = "exo"
    runs: list[float] = []
    """Aggregate tokens/s of each repeat."""


class MachineInfo(BenchModel):
    platform: str
    python: str
    cpu_count: int
    cpu_model: str = "unknown"
    """The processor's name ("unknown" in reports saved before it was recorded)."""
    load_average: tuple[float, float, float]
    mlx_version: str
    mlx_lm_version: str
    blas: str
    matmul_gflops: float
    exo_commit: str


class SectionRun(BenchModel):
    """Where and how one section's numbers were measured: a report may be stitched from several runs."""

    exo_commit: str
    cpu: str
    load_average: tuple[float, float, float]
    """At the end of the section's run."""
    command: str
    finished_utc: str


SectionKey = Literal["servers", "parser", "constrained", "blas", "speculation", "pipeline", "agent-sessions"]
"""`servers` covers sections 1, 2 and 4, which one run measures together."""


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
    concurrency_repeats: int = 1
    arrival_running_streams: int = 0
    """Streams already decoding when the timed request arrives (0: not measured)."""
    arrival_max_tokens: int = 0
    pass_cost_repeats: int = 5
    """Timed decode steps per batch size when measuring what a step over several sequences costs."""


class ConstrainedSettings(BenchModel):
    """The knobs of the constrained-decoding section (kept apart so reports saved before it existed still load)."""

    decode_tools: tuple[str, ...] | None
    """Names of the tools offered in the decode prompt; None offers the whole opencode tool set."""
    max_tokens: int
    repeats: int
    """Decode runs per mode; the modes take turns within each repeat."""
    compile_repeats: int


class ConstrainedDecodeRow(BenchModel):
    """Decode speed of one `tool_choice` mode on the same prompt, timed in-process around exo's `generate_tokens`."""

    mode: str
    constrained: bool
    ms_per_token: list[float]
    """Per run: (last token time − first token time) / (tokens − 1), so prefill is excluded."""
    median_ms_per_token: float
    completion_tokens: int
    same_tokens_as_unconstrained: bool
    """Whether the greedy output was token for token the unconstrained one (then both did identical model work)."""
    text: str


class GrammarCompileRow(BenchModel):
    """Building the logits processor for one request shape (`logits_processors_for`, as the runner calls it)."""

    mode: str
    tool_count: int
    schema_chars: int
    """Characters of the tools' JSON (names, descriptions and parameter schemas) the grammar is built from."""
    cold_ms: float
    """Median over repeats with the grammar cache emptied (the llguidance tokenizer already built)."""
    cached_ms: float
    """Median of the same request again: the compiled grammar comes from the cache."""


class ConstrainedReport(BenchModel):
    """Section 5: what grammar-constrained tool calling costs per token and per request."""

    settings: ConstrainedSettings
    tool_format: str
    prompt_tokens: int
    vocabulary_size: int
    decode: list[ConstrainedDecodeRow]
    first_request_ms: float
    """The first constrained request after the model loaded: llguidance tokenizer build plus grammar compile."""
    tokenizer_build_ms: float
    compile: list[GrammarCompileRow]
    load_average: tuple[float, float, float]
    """Load average when the section finished (it may be measured apart from the other sections)."""
    exo_commit: str


class BlasMeasurement(BenchModel):
    """One run of one BLAS candidate in a fresh process (`bench.blas_worker`)."""

    library: str | None
    """The file `cblas_sgemm` resolved to; None for mlx's bundled reference BLAS."""
    self_check_gflops: float
    """exo's runner self-check: best single 512×512 float32 matmul over 0.15 s."""
    sustained_gflops: float
    """Mean 512×512 float32 matmul rate over a few seconds, stalls included."""
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    """None when the run measured matmuls only (the contended runs)."""


class BlasRow(BenchModel):
    candidate: str
    chosen_by_exo: bool
    quiet: list[BlasMeasurement]
    contended: list[BlasMeasurement]
    """The same candidate while one busy-looping process competes for a core (matmuls only)."""


class BlasSection(BenchModel):
    """Section 6: the BLAS candidates for Linux x86_64, measured in alternation."""

    rows: list[BlasRow]
    rounds: int
    model_id: str | None
    prefill_tokens: int
    decode_tokens: int
    cpu: str
    load_average: tuple[float, float, float]
    exo_commit: str


class ArrivalRow(BenchModel):
    """A request arriving while other streams decode on the same server: how long until its first token."""

    system: str
    running_streams: int
    ttft_s: float
    alone_ttft_s: float
    """The same request shape's time to first token with nothing else running."""


class SpeculationSettings(BenchModel):
    max_tokens: int
    repeats: int
    """Runs per mode and workload; the modes take turns within each repeat."""
    edit_tools: tuple[str, ...] | None = None
    """The opencode tools the edit workload offers (None: all of them)."""


class SpeculationRow(BenchModel):
    """One workload decoded in one speculation mode, timed around the runner's own scheduler."""

    workload: str
    mode: str
    tokens_per_s: list[float]
    """Per run: (tokens − 1) / (last token time − first token time), so prefill is excluded."""
    median_tokens_per_s: float
    completion_tokens: int
    drafted: int
    """Draft tokens verified, over all runs."""
    accepted: int
    forward_passes: int
    """Decode forward passes over all runs (a pass verifying a draft counts once)."""
    same_tokens_as_off: bool
    """Whether every run's greedy output was token for token the output without speculation."""
    text: str


class SpeculationReport(BenchModel):
    settings: SpeculationSettings
    prompt_tokens: dict[str, int]
    rows: list[SpeculationRow]
    pass_cost_ratios: dict[int, float] = {}
    """Seconds of a solo forward pass feeding N tokens over a one-token pass, as the default mode measured them."""
    load_average: tuple[float, float, float]
    exo_commit: str
    model_id: str | None = None
    """The model measured, where it is not the report's own (`speculation_other_models`)."""


class ConcurrentStreams(BenchModel):
    """`streams` greedy streamed requests sent at once to one model (decoded together in its batch)."""

    streams: int
    completion_tokens: int
    """All streams' tokens together."""
    wall_s: float
    """First request sent → last stream finished."""
    cpu_s: float | None = None
    """CPU time the nodes and their runners used meanwhile (absent from runs before the bench measured it)."""

    @property
    def aggregate_tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s

    @property
    def cores_busy(self) -> float | None:
        """How many cores the nodes kept busy on average during the run."""
        return None if self.cpu_s is None else self.cpu_s / self.wall_s


class PipelineRow(BenchModel):
    """Greedy streamed requests to one model split over `nodes` local nodes (pipeline parallel)."""

    nodes: int
    ttft_s: list[float]
    """Per request: request sent → first generated text."""
    ms_per_token: list[float]
    """Per request: (stream end − first text) / (tokens − 1), so prefill is excluded."""
    completion_tokens: int
    concurrent: list[ConcurrentStreams] = []
    """Aggregate throughput by number of streams at once (absent from runs before pipelines batched)."""
    load_average: tuple[float, float, float] | None = None
    """Load average when this node count's runs finished (absent from earlier runs)."""


class OverlapRun(BenchModel):
    """Greedy decode of `rows` rows on a 2-rank split, forward passes only, in `micro_batches` alternating groups."""

    rows: int
    micro_batches: int
    tokens: int
    wall_s: float
    threads_sleep: bool = True
    """Whether the BLAS's idle threads slept at once (a pipeline runner's setting) or spun (the default)."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


class OverlapMeasurement(BenchModel):
    """Whether overlapping micro-batches keeps a 2-rank split busier (`bench.pipeline_overlap`)."""

    runs: list[OverlapRun]
    steps: int
    """Timed decode steps per run (after a few untimed ones)."""
    load_average: tuple[float, float, float]


class PipelineSection(BenchModel):
    """Section 8: one model over 1, 2 and 3 exo nodes on 127.0.0.1; every hop costs a loopback send per token."""

    rows: list[PipelineRow]
    model_id: str
    max_tokens: int
    requests: int
    """Timed requests per node count, after one untimed warm-up request."""
    load_average: tuple[float, float, float]
    """Load average when the section finished."""
    exo_commit: str
    cpu_count: int | None = None
    """The machine's cores, which every node shares (absent from earlier runs)."""
    overlap: OverlapMeasurement | None = None
    """The overlapped micro-batches lever measured on its own (absent from earlier runs)."""


SessionPhase = Literal["cold", "warm", "restarted"]


class SessionStep(BenchModel):
    """One request of an agent-sessions replay, timed over HTTP."""

    system: str
    workload: str
    """What was replayed: `opencode` (a session's turns) or `claude-code` (its first request)."""
    session: int
    turn: int
    phase: SessionPhase
    """What the server could have cached: nothing (`cold`), earlier requests of this process (`warm`), or only what
    a previous process left on disk (`restarted`: the server was stopped and started again)."""
    interleaved: bool
    """One of the sessions whose turns alternate with 3 others'."""
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


AgentSessionsScope = Literal["full", "claude-code"]
"""What section 9 replays: every workload, or only the captured Claude Code first request (cold, again, restarted)."""


class AgentSessionsSection(BenchModel):
    """Section 9: agent sessions replayed cold, from memory and, after a restart, from disk."""

    steps: list[SessionStep]
    model_id: str
    max_tokens: int
    load_average: tuple[float, float, float]
    """Load average when the section finished."""
    exo_commit: str
    scope: AgentSessionsScope = "full"
    """Absent from reports saved before the `claude-code` scope existed (they replayed everything)."""


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
    servers_measured_apart: bool = False
    """Sections 1, 2 and 4 come from an `--only servers` run (`wall_s` is its time), not from a full run."""
    constrained: ConstrainedReport | None = None
    """Absent from reports saved before the section existed."""
    blas: BlasSection | None = None
    """Absent from reports saved before the section existed (and off Linux x86_64)."""
    arrival: list[ArrivalRow] = []
    """Time to first token of a request that arrives while others decode (empty in reports saved before)."""
    speculation: SpeculationReport | None = None
    """Absent from reports saved before the section existed."""
    pipeline: PipelineSection | None = None
    """Absent from reports saved before the section existed."""
    agent_sessions: AgentSessionsSection | None = None
    """Absent from reports saved before the section existed."""
    speculation_other_models: list[SpeculationReport] = []
    """Section 7 measured again on other models (`--only speculation --model`): a model that copies what the
    default one paraphrases shows what speculation does for an agent's edit."""
    batch_pass_seconds: dict[int, float] = {}
    """Bare mlx-lm: best seconds of one decode step over N sequences (empty in reports saved before)."""
    planned_batch_pass_seconds: dict[int, float] = {}
    """The same steps through exo's matmul plan, as exo's runner computes them (empty in reports saved before)."""
    runs: dict[SectionKey, SectionRun] = {}
    """The run each section's numbers come from (sections measured before this was recorded are absent)."""
