"""Render prompts with a model's own chat template."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.shared.types.tasks import PromptLayout, PromptMessage, ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.format import HistoryNeeds
from exo.worker.engines.mlx.chat_messages import TemplateMessage, to_template_messages, tool_description
from exo.worker.engines.mlx.prompt_budget import encode_within
from exo.worker.engines.mlx.prompt_layout import tools_first

_OPENAI_SHAPE = HistoryNeeds()


@dataclass(frozen=True)
class RenderedPrompt:
    tokens: list[int]
    text: str
    # The template opened a reasoning block itself (e.g. ends with "<think>\n"): generation starts inside it.
    starts_in_reasoning: bool


def chat_template_text(tokenizer: TokenizerWrapper) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        return template
    if isinstance(template, dict):  # named templates: prefer the tool-use one
        templates = cast(dict[str, str], template)
        return templates.get("tool_use") or templates.get("default") or next(iter(templates.values()), None)
    return None


def _tool_dicts(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
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
