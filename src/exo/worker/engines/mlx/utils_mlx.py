"""Load a model with mlx-lm and render prompts with its chat template."""

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx import nn
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load as mlx_lm_load
from mlx_lm.utils import load_model as mlx_lm_load_model
from mlx_lm.utils import load_tokenizer

from exo.models.errors import ModelLoadError
from exo.models.shard_files import missing_weight_files
from exo.shared.types.api import FunctionDefinition
from exo.shared.types.tasks import PromptLayout, PromptMessage, ToolPolicy
from exo.shared.types.worker.shards import PipelineStrategy, ShardAssignment
from exo.tool_calls.format import HistoryNeeds
from exo.worker.engines.mlx.chat_messages import TemplateMessage, to_template_messages, tool_description
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.distributed.layer_split import split_layers
from exo.worker.engines.mlx.prompt_budget import encode_within
from exo.worker.engines.mlx.prompt_layout import tools_first

logger = logging.getLogger(__name__)

_OPENAI_SHAPE = HistoryNeeds()

DEFAULT_CONTEXT_LENGTH = 4096


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: TokenizerWrapper
    context_length: int
    dtype: str
    shard: ShardAssignment
    # The width of the logits: how many tokens sampling chooses from (top_k must stay below it).
    vocabulary_size: int
    # The ring this rank's pipeline runs over, and how the model was split (None for a whole model).
    group: mx.distributed.Group | None = None
    strategy: PipelineStrategy | None = None


@dataclass(frozen=True)
class RenderedPrompt:
    tokens: list[int]
    text: str
    # The template opened a reasoning block itself (e.g. ends with "<think>\n"): generation starts inside it.
    starts_in_reasoning: bool


def _context_length(config: dict[str, Any]) -> int:
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    text_config = config.get("text_config")
    if isinstance(text_config, dict):
        return _context_length(cast(dict[str, Any], text_config))
    return DEFAULT_CONTEXT_LENGTH


def _vocabulary_size(config: dict[str, Any], tokenizer: TokenizerWrapper) -> int:
    """The logits' width from the config (it can exceed the tokenizer's vocabulary: padded embeddings)."""
    for candidate in (config, config.get("text_config")):
        if isinstance(candidate, dict):
            value = cast(dict[str, Any], candidate).get("vocab_size")
            if isinstance(value, int) and value > 0:
                return value
    return len(tokenizer.vocab)


def load_model(
    path: Path,
    shard: ShardAssignment,
    *,
    trust_remote_code: bool = False,
    group: mx.distributed.Group | None = None,
    cpu_kernels: CpuKernels | None = None,
) -> LoadedModel:
    """Load `path` (an mlx-lm directory) for `shard`; raises ModelLoadError naming the path and the cause.

    `cpu_kernels` applies the CPU engine's replacements it has on (default: those `--cpu-kernels auto` has here).

    A pipeline shard (world size > 1) needs the ring `group` it runs over; only its layers' weights are read.
    `trust_remote_code` lets the model directory's own Python run: a custom architecture (`model_file` in
    config.json) and a custom tokenizer class. Off, such a model fails to load with a message saying so.
    """
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist")
    kernels = cpu_kernels or CpuKernels()
    if shard.world_size != 1:
        if group is None:
            raise ModelLoadError("a pipeline shard needs the ring group it runs over")
        return _load_pipeline_stage(path, shard, group, trust_remote_code, kernels)
    try:
        model, tokenizer = mlx_lm_load(
            str(path), tokenizer_config={"trust_remote_code": trust_remote_code}, trust_remote_code=trust_remote_code
        )[:2]
    except Exception as error:
        raise ModelLoadError(f"cannot load model from {path}: {type(error).__name__}: {error}") from error
    return _loaded(model, tokenizer, _read_config(path), shard, kernels)


def _load_pipeline_stage(
    path: Path, shard: ShardAssignment, group: mx.distributed.Group, trust_remote_code: bool, kernels: CpuKernels
) -> LoadedModel:
    """Build the model lazily, cut it down to this rank's layers, then read only the weights those need."""
    missing = missing_weight_files(path, shard.start_layer, shard.end_layer)
    if missing:
        raise ModelLoadError(
            f"cannot load layers {shard.start_layer}..{shard.end_layer} of {path}: missing {', '.join(missing)}"
        )
    try:
        model, config = mlx_lm_load_model(path, lazy=True, strict=False, trust_remote_code=trust_remote_code)
        tokenizer = load_tokenizer(
            path, {"trust_remote_code": trust_remote_code}, eos_token_ids=config.get("eos_token_id", None)
        )
        strategy = split_layers(model, group, shard)
    except Exception as error:
        raise ModelLoadError(f"cannot load model from {path}: {type(error).__name__}: {error}") from error
    return _loaded(model, tokenizer, config, shard, kernels, group=group, strategy=strategy)


def _loaded(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    config: dict[str, Any],
    shard: ShardAssignment,
    kernels: CpuKernels,
    *,
    group: mx.distributed.Group | None = None,
    strategy: PipelineStrategy | None = None,
) -> LoadedModel:
    """Finish loading: the CPU engine's replacements, weights materialised, and what the runner reports."""
    dtype = kernels.prepare_model(model)
    mx.eval(model.parameters())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        context_length=_context_length(config),
        dtype=dtype,
        shard=shard,
        vocabulary_size=_vocabulary_size(config, tokenizer),
        group=group,
        strategy=strategy,
    )


def _read_config(path: Path) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((path / "config.json").read_text()))


def chat_template_text(tokenizer: TokenizerWrapper) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        return template
    if isinstance(template, dict):  # named templates: prefer the tool-use one
        templates = cast(dict[str, str], template)
        return templates.get("tool_use") or templates.get("default") or next(iter(templates.values()), None)
    return None


def _tool_dicts(tools: tuple[FunctionDefinition, ...]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": tool_description(tool)} for tool in tools]


def apply_chat_template(
    tokenizer: TokenizerWrapper,
    messages: tuple[PromptMessage, ...],
    tool_policy: ToolPolicy,
    template_kwargs: Mapping[str, object] | None = None,
    history: HistoryNeeds = _OPENAI_SHAPE,
    *,
    context_length: int | None = None,
    layout: PromptLayout = "template",
) -> RenderedPrompt:
    """Render `messages` (and the offered tools) into prompt tokens with the model's own chat template.

    `template_kwargs` are extra template variables from the client (the API has already refused reserved names);
    `history` is what the model's tool format needs of rendered history. With `context_length`, a prompt that
    leaves no room to generate raises ContextLengthExceededError, found without tokenising much more of it than
    the context holds (see prompt_budget.py). `layout` "tools-first" puts the tool block before the system text
    where the template allows it exactly (prompt_layout.py).
    """
    template = chat_template_text(tokenizer)
    offered = tool_policy.tools if tool_policy.mode != "none" else ()
    template_messages = to_template_messages(messages, chat_template=template, tools=offered, needs=history)
    kwargs: dict[str, Any] = {**(template_kwargs or {}), "add_generation_prompt": True}
    if offered and template is not None and "tools" in template:
        kwargs["tools"] = _tool_dicts(offered)
    if template_messages and template_messages[-1]["role"] == "assistant":
        # A trailing assistant turn is a prefill the model continues, not a finished turn.
        kwargs["add_generation_prompt"] = False
        kwargs["continue_final_message"] = True

    def render(rendered: list[TemplateMessage], with_tools: bool) -> str:
        arguments = kwargs if with_tools else {key: value for key, value in kwargs.items() if key != "tools"}
        return cast(str, tokenizer.apply_chat_template(rendered, tokenize=False, **arguments))

    text = render(template_messages, True)
    if layout == "tools-first" and "tools" in kwargs:
        text = tools_first(render, template_messages, text) or text

    def encode(piece: str) -> list[int]:
        return cast(list[int], tokenizer.encode(piece, add_special_tokens=False))

    tokens = encode(text) if context_length is None else encode_within(encode, text, context_length)
    think_start = tokenizer.think_start if tokenizer.has_thinking else None
    starts_in_reasoning = think_start is not None and _opens_reasoning(text, think_start, tokenizer)
    return RenderedPrompt(tokens=tokens, text=text, starts_in_reasoning=starts_in_reasoning)


def _opens_reasoning(text: str, think_start: str, tokenizer: TokenizerWrapper) -> bool:
    stripped = text.rstrip()
    think_end = tokenizer.think_end
    return stripped.endswith(think_start) and not (think_end is not None and stripped.endswith(think_end))
