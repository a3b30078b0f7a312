"""What crosses the runner-subprocess boundary, and what the engine yields per generated token."""

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from exo.shared.types.blas import BlasReport, MatmulPlanReport
from exo.shared.types.chunks import Chunk, Usage
from exo.shared.types.common import FinishReason, FrozenModel, TaskId
from exo.shared.types.cpu_kernels import CpuKernelsReport, CpuKernelsSetting, CpuWeightsSetting
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.tls_link import TlsLinkConfig
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import PipelineStrategy, ShardAssignment


class GenerationResponse(FrozenModel):
    """One step of engine output: the decoded text segment for a token (possibly empty while bytes accumulate)."""

    text: str
    token: int
    finish_reason: FinishReason | None = None


class CheckpointFacts(FrozenModel):
    """What the model's files say about it, as model listings (Ollama's /api/tags, /api/show) describe a model."""

    # The architecture (config.json's `model_type`: qwen2, llama...).
    family: str
    # Parameters once dequantized, and the weight files' bytes as stored (of the files this runner has).
    parameter_count: int
    file_bytes: int
    # How the weights are stored: Q4, Q8 (MLX quantized to that many bits), BF16, F16 or F32.
    quantization: str
    # The tensor bytes of the GGUF the model was imported from and kept (what `--cpu-weights gguf` holds); None
    # where it kept none.
    gguf_bytes: int | None = None

    def stored_bytes(self, weights: str) -> int:
        """The bytes `footprint.held_bytes` starts from for weights held as `weights`: the kept GGUF's tensors under
        gguf where there is one, else the weight files'."""
        return self.gguf_bytes if weights == "gguf" and self.gguf_bytes is not None else self.file_bytes


class ModelDescription(FrozenModel):
    """What model listings (/v1/models, Ollama's /api/tags and /api/show) say of a model: read from its files and
    tokenizer before the weights load, so that a client asking while the model loads sees what it will be able to do
    (VS Code Copilot, for one, offers agent mode from `tools` at start-up)."""

    context_length: int
    tool_format: str | None
    supports_reasoning: bool
    # The width of the model's logits (the tokens sampling chooses from); None from runners that do not say.
    vocab_size: int | None = None
    # The checkpoint's architecture, size and storage (None where its files could not be read).
    checkpoint: CheckpointFacts | None = None


class ModelMetadata(ModelDescription):
    """What the runner learned while loading, reported to the worker for /v1/models and /state."""

    dtype: str
    batch_size: int = 1
    """How many tasks the runner decodes at once (continuous batching); the worker sends it that many."""
    # The BLAS the runner's float32 matmuls use and its measured speed (None from runners that did not check).
    blas: BlasReport | None = None
    # How the runner computes few-row float32 products (None where it planned none: off, or no float32 weights).
    matmul_plan: MatmulPlanReport | None = None
    # Which of the CPU engine's replacements the runner uses (None from runners that do not say).
    cpu_kernels: CpuKernelsReport | None = None
    # How a pipeline rank's model was split (None for a whole model).
    pipeline: PipelineStrategy | None = None
    # Bytes of weights the runner holds as loaded (int8 matrices and their scales included; None: not reported).
    weights_bytes: int | None = None


# ---- worker → runner -------------------------------------------------------------------------


class RunnerBootstrap(FrozenModel):
    kind: Literal["bootstrap"] = "bootstrap"
    model_path: str
    shard: ShardAssignment
    tool_format_override: str | None = None
    prefix_cache_bytes: int = 0
    prefix_cache_dir: str | None = None
    """Where KV snapshots of prompt prefixes are kept on disk (a folder per model inside); None: no disk tier."""
    prefix_cache_disk_bytes: int = 0
    """The byte budget of those snapshots, per model; 0: no disk tier."""
    trust_remote_code: bool = False
    decode: DecodeSettings = DecodeSettings()
    cpu_kernels: CpuKernelsSetting = "auto"
    """The CPU engine's replacements: `auto` on a Linux CPU machine, `off` nowhere (engines/mlx/cpu)."""
    cpu_weights: CpuWeightsSetting = "float32"
    """What the CPU engine holds the weights as where its replacements apply (`--cpu-weights`; the runner resolves
    `auto` for this machine and model, and its CpuKernelsReport says what it chose)."""
    pipeline_tls: TlsLinkConfig | None = None
    """A keyed cluster's certificates: a pipeline rank's sockets to the other ranks then go through a TLS relay."""


class RunTask(FrozenModel):
    kind: Literal["run_task"] = "run_task"
    task: GenerationTask


class CancelTask(FrozenModel):
    kind: Literal["cancel_task"] = "cancel_task"
    task_id: TaskId


class Shutdown(FrozenModel):
    kind: Literal["shutdown"] = "shutdown"


RunnerRequest = Annotated[RunnerBootstrap | RunTask | CancelTask | Shutdown, Field(discriminator="kind")]
RunnerRequestAdapter: TypeAdapter[RunnerRequest] = TypeAdapter(RunnerRequest)


# ---- runner → worker -------------------------------------------------------------------------


class RunnerDescribed(FrozenModel):
    """The model's description, sent as soon as the runner has read its tokenizer (its weights still loading)."""

    kind: Literal["described"] = "described"
    description: ModelDescription


class RunnerReady(FrozenModel):
    kind: Literal["ready"] = "ready"
    metadata: ModelMetadata


class RunnerLoadFailed(FrozenModel):
    kind: Literal["load_failed"] = "load_failed"
    message: str


class StepTimes(FrozenModel):
    """Totals over the decode steps a runner took with the same number of requests decoding (the host-overhead
    meter): wall time, the part spent waiting on the model's evaluation, prompt pieces fed in the same steps, and the
    rest (the host's own work) by part."""

    steps: int = 0
    step_seconds: float = 0.0
    device_seconds: float = 0.0
    """The host thread blocked waiting for the model's evaluation."""
    prefill_seconds: float = 0.0
    """Prompt pieces of other requests fed in these steps: model work, not overhead of the decoding ones."""
    beside_seconds: float = 0.0
    """Work a helper thread did for these steps while the loop went on (their tokens accepted beside the next launch):
    it ran while the loop's own parts went on, off the loop's critical path, so it is not one of the host's parts."""
    host_seconds: dict[str, float] = Field(default_factory=dict[str, float])
    """The host's own work by part: messages, admit, graph (building the forward pass in Python), launch,
    processors, detokenize, parse, send, and loop (the rest: scheduling, bookkeeping). Their sum is step - device -
    prefill."""

    @property
    def host_total_seconds(self) -> float:
        return sum(self.host_seconds.values())


class TaskChunk(FrozenModel):
    kind: Literal["chunk"] = "chunk"
    task_id: TaskId
    chunk: Chunk
    # Tokens the task has generated so far (on the last chunk of each step): the node's tokens-per-second-now.
    generated_tokens: int | None = None


class PrefixCacheUsage(FrozenModel):
    """What a runner's prefix cache holds: its memory tier, the disk snapshots waiting in memory to be written, and
    the disk tier."""

    memory_bytes: int
    memory_entries: int
    queued_bytes: int = 0
    """KV bytes of the disk snapshots not yet written (the one being written included), held in memory until they
    are (at most the memory tier's budget; a snapshot the memory tier still keeps is counted in both)."""
    disk_bytes: int = 0
    disk_entries: int = 0
    snapshots_written: int = 0
    """Disk snapshots written since the runner started."""
    snapshots_dropped: int = 0
    """Disk snapshots dropped from a full queue unwritten since the runner started: sessions ended faster than
    they could be written."""
    snapshots_loaded: int = 0
    """Disk snapshots loaded for a prompt since the runner started."""
    snapshots_passed_over: int = 0
    """Disk snapshots holding more of a prompt than memory did that were not loaded, since the runner started: this
    runner measured that prefilling the tokens they added costs less than loading them, or, before it had measured
    both, they added fewer than 32 tokens."""
    prefill_seconds_per_token: float | None = None
    """The runner's running average of a prompt token's prefill (None before a piece was measured)."""
    load_seconds_per_byte: float | None = None
    """The runner's running average of a byte of disk snapshot loaded (None before a load)."""


class RunnerMemory(FrozenModel):
    """What a runner holds in memory by its own accounts (the worker measures its resident size from outside)."""

    mlx_active_bytes: int
    """Bytes of arrays mlx holds (the weights mlx loaded, KV caches, a step's buffers; on a GPU its device memory)."""
    mlx_cache_bytes: int
    """Bytes mlx keeps of freed arrays for reuse (emptied as the runner turns idle)."""
    prefix_cache: PrefixCacheUsage | None = None
    """None where the runner keeps no prefix cache."""


class TaskDone(FrozenModel):
    """The runner is free again after this task (its last chunk was a Finish or Error chunk)."""

    kind: Literal["task_done"] = "task_done"
    task_id: TaskId
    generated_tokens: int = 0
    cancelled: bool = False
    step_times: dict[int, StepTimes] | None = None
    """The runner's host-overhead meter since it started (decode-step times by requests decoding in the step), when
    the runner measures it."""
    prefill_pieces: dict[int, int] | None = None
    """Prompt pieces the runner prefilled since it started, by how many prompts each one fed (1: a prompt alone, more:
    prompts admitted together and fed in one batched pass), when the runner counts them."""
    usage: Usage | None = None
    """A cancelled task's usage so far (a finished task's came in its FinishChunk)."""
    ggml_threads: int | None = None
    """ggml's thread count when the task ended (`--cpu-weights q8_0` / `gguf` on a CPU: it follows the cores other
    processes leave); None where the runner runs no ggml products."""
    memory: RunnerMemory | None = None
    """The runner's memory when the task ended."""


class StreamChunks(FrozenModel):
    """One task's chunks from one serving step, in order."""

    task_id: TaskId
    chunks: list[Chunk]
    # Tokens the task has generated so far, as of its last chunk here (TaskChunk's count on a step's last chunk).
    generated_tokens: int | None = None


class StepOutput(FrozenModel):
    """All one serving step produced, in one message: each task's chunks, then the tasks that ended in the step.

    The supervisor hands it on as the TaskChunk and TaskDone messages it stands for, in that order (a task's chunks
    before its end): one pipe message per step instead of one per chunk and task."""

    kind: Literal["step_output"] = "step_output"
    streams: list[StreamChunks] = Field(default_factory=list[StreamChunks])
    endings: list[TaskDone] = Field(default_factory=list[TaskDone])

    def task_messages(self) -> list[TaskChunk | TaskDone]:
        """The per-task messages this step stands for, in the order they are handled."""
        messages: list[TaskChunk | TaskDone] = []
        for stream in self.streams:
            last = len(stream.chunks)
            for position, chunk in enumerate(stream.chunks, start=1):
                count = stream.generated_tokens if position == last else None
                messages.append(TaskChunk(task_id=stream.task_id, chunk=chunk, generated_tokens=count))
        messages.extend(self.endings)
        return messages


class MatmulPlanRefined(FrozenModel):
    """The runner finished refining its matmul plan while idle (and checking it in whole forward passes)."""

    kind: Literal["matmul_plan_refined"] = "matmul_plan_refined"
    report: MatmulPlanReport


class RunnerMemoryReport(FrozenModel):
    """The runner's memory once it turns idle (freed buffers released, snapshots written), and a split model's
    other ranks' as tasks leave them (rank 0's travels with its TaskDones): sent when it changed."""

    kind: Literal["memory"] = "memory"
    memory: RunnerMemory


class GgmlThreadsReport(FrozenModel):
    """ggml's thread count when a task left the batch, from a pipeline or tensor rank other than 0: such a rank
    ends no task of its own with its supervisor (rank 0 sends the TaskDones), so it reports the count alone."""

    kind: Literal["ggml_threads"] = "ggml_threads"
    threads: int


RunnerResponse = Annotated[
    RunnerDescribed
    | RunnerReady
    | RunnerLoadFailed
    | TaskChunk
    | TaskDone
    | StepOutput
    | MatmulPlanRefined
    | GgmlThreadsReport
    | RunnerMemoryReport,
    Field(discriminator="kind"),
]
RunnerResponseAdapter: TypeAdapter[RunnerResponse] = TypeAdapter(RunnerResponse)
