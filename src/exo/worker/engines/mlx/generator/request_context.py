"""What a chat completion is decoded with besides its own task: the runner's context, the model's reasoning markers,
the loop guard's verdict on the conversation's real loops, and the refusal that answers a request without decoding."""

from collections.abc import Mapping
from dataclasses import dataclass, field

from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.shared.types.chunks import ErrorChunk, FinishChunk
from exo.shared.types.tasks import GenerationTask, LoopGuardPolicy, ToolPolicy
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.tool_calls import ToolFormatName
from exo.tool_calls.grammar.spec import ReasoningMarkers
from exo.tool_calls.loop_guard import CallHistory, CallKey
from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
from exo.worker.engines.mlx.loaded_model import LoadedModel


@dataclass
class EngineContext:
    """What the runner keeps between tasks."""

    loaded: LoadedModel
    tool_format: ToolFormatName
    prefix_cache: PrefixCache | None
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    # Refines the model's matmul plan while no task runs (None where nothing was planned).
    matmul_planner: MatmulPlanner | None = None


def reasoning_markers(tokenizer: TokenizerWrapper, starts_in_reasoning: bool) -> ReasoningMarkers | None:
    """The model's own think markers (none for models without them, so `<think>` stays plain content there)."""
    start, end = tokenizer.think_start, tokenizer.think_end
    if not tokenizer.has_thinking or not start or not end:
        return None
    return ReasoningMarkers(start=start, end=end, opened_in_prompt=starts_in_reasoning)


class ImmediateReplyError(Exception):
    """The request is answered without decoding: `chunk` is its whole answer (a refusal the API turns into an HTTP
    error, or the prompt-token count a counting request asked for)."""

    def __init__(self, chunk: ErrorChunk | FinishChunk) -> None:
        super().__init__(chunk.message if isinstance(chunk, ErrorChunk) else "prompt tokens counted")
        self.chunk = chunk


def loop_guard_policy(context: EngineContext, policy: ToolPolicy) -> LoopGuardPolicy:
    """The request's own loop-guard policy, else the node's."""
    return policy.loop_guard or context.decode.loop_guard


@dataclass(frozen=True)
class LoopGuardCalls:
    """What the loop guard does with the calls that would make a real loop (`CallHistory.looping_calls`)."""

    withdrawn: frozenset[CallKey] = frozenset()
    """Taken back once written; the reply is then decoded again without them."""
    policy: LoopGuardPolicy = "off"
    kept: frozenset[CallKey] = frozenset()
    """Real loops the request cannot take back (`kept_because` says why): sent as written, and reported."""
    kept_because: str = ""
    reasons: Mapping[CallKey, str] = field(default_factory=dict[CallKey, str])
    """Why each of those calls is a real loop (`Loop.reason`), for the notices."""


def loop_guard_calls(
    context: EngineContext, task: GenerationTask, history: CallHistory, *, rewinds: bool
) -> LoopGuardCalls:
    """What `block` and `answer` do with this request's real loops. Never a grammar that forbids a call's exact
    arguments: a model kept from closing the string it meant to write writes on, and the client would get a call
    the model never made. A loop is taken back once written, or, where the reply cannot go back, reported."""
    params = task.params
    policy = loop_guard_policy(context, params.tool_policy)
    looping = frozenset(history.looping_calls())
    if policy in ("off", "warn") or not looping:
        return LoopGuardCalls(policy=policy)
    reasons = {call: loop.reason() for call in looping if (loop := history.loop(call)) is not None}
    if params.tool_policy.mode != "auto":
        why = f'tool_choice "{params.tool_policy.mode}" asks for a call, so the reply cannot go on without one'
    elif params.structured_output is not None:
        why = "a response_format holds the reply"
    elif not rewinds:
        why = "this instance's decoder cannot take a call back (pipeline-parallel)"
    else:
        return LoopGuardCalls(withdrawn=looping, policy=policy, reasons=reasons)
    return LoopGuardCalls(policy=policy, kept=looping, kept_because=why, reasons=reasons)
