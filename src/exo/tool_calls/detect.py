"""Pick the tool-call format from what the model shows: its `tool_parser_type`, else its chat template."""

from collections.abc import Container

from exo.tool_calls.names import ToolFormatName

# mlx-lm's parser names that differ from ours.
_ALIASES = {"json_tools": ToolFormatName.HERMES}

# (texts that must all be in the template, format), first match wins. The order is mlx-lm's for the families it
# knows (more specific markers first: GLM's `<arg_key>` before a plain `<tool_call>`), then the families it does not.
_TEMPLATE_SIGNS: tuple[tuple[tuple[str, ...], ToolFormatName], ...] = (
    (("<|channel|>", "<|message|>"), ToolFormatName.HARMONY),
    (("｜DSML｜",), ToolFormatName.DEEPSEEK_V32),
    (("<｜tool▁calls▁begin｜>",), ToolFormatName.DEEPSEEK_V31),
    (("<minimax:tool_call>",), ToolFormatName.MINIMAX_M2),
    (("<|tool_call>", "<tool_call|>"), ToolFormatName.GEMMA4),
    (("<start_function_call>",), ToolFormatName.FUNCTION_GEMMA),
    (("<longcat_tool_call>",), ToolFormatName.LONGCAT),
    (("<arg_key>",), ToolFormatName.GLM47),
    (("<|tool_list_start|>",), ToolFormatName.PYTHONIC),
    (("<|tool_call_start|>",), ToolFormatName.PYTHONIC),
    (("<tool_call>\\n<function=",), ToolFormatName.QWEN3_CODER),
    (("<tool_call>\n<function=",), ToolFormatName.QWEN3_CODER),
    (("<|tool_calls_section_begin|>",), ToolFormatName.KIMI_K2),
    (('<function name="', '<param name="'), ToolFormatName.MINICPM5),
    (("[TOOL_CALLS]",), ToolFormatName.MISTRAL),
    (("<atem:function_calls>",), ToolFormatName.MUSE_SPARK),
    (("<tool_call>", "tool_call.name"), ToolFormatName.HERMES),
    (("func_name1(",), ToolFormatName.PYTHONIC),
    (("[func_name(",), ToolFormatName.PYTHONIC),
    (("<|python_tag|>",), ToolFormatName.LLAMA3_JSON),
    (('"parameters": dictionary of argument name',), ToolFormatName.LLAMA3_JSON),
    (("<tool_call>",), ToolFormatName.HERMES),
)
# Tokenizers whose template does not name their tool tokens (LFM2.5 conversions, Kimi K3).
_VOCABULARY_SIGNS: tuple[tuple[tuple[str, ...], ToolFormatName], ...] = (
    (("<|open|>", "<|close|>", "<|sep|>"), ToolFormatName.KIMI_K3),
    (("<|tool_call_start|>", "<|tool_call_end|>"), ToolFormatName.PYTHONIC),
)


def _named(name: str) -> ToolFormatName | None:
    if name in _ALIASES:
        return _ALIASES[name]
    try:
        return ToolFormatName(name)
    except ValueError:
        return None


def detect_tool_format(
    chat_template: str | None,
    tool_parser_type: str | None = None,
    override: str | None = None,
    vocabulary: Container[str] = (),
) -> ToolFormatName:
    """The format to parse this model's tool calls with.

    `override` (a user setting) wins and must name a format; then `tool_parser_type` from the tokenizer config
    (mlx-lm's names); then the markers the chat template writes; then tool tokens in `vocabulary` the template does
    not name. A template with no tool syntax gets `generic` (hermes syntax, described to the model by us).
    """
    if override is not None:
        return ToolFormatName(override)
    if tool_parser_type is not None and (named := _named(tool_parser_type)) is not None:
        return named
    template = chat_template or ""
    for texts, tool_format in _TEMPLATE_SIGNS:
        if all(text in template for text in texts):
            return tool_format
    for tokens, tool_format in _VOCABULARY_SIGNS:
        if all(token in vocabulary for token in tokens):
            return tool_format
    return ToolFormatName.GENERIC
