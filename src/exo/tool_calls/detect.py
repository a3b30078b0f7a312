"""Pick the tool-call format from what the model shows: mlx-lm's `tool_parser_type`, else its chat template."""

from exo.tool_calls.names import ToolFormatName

# mlx-lm's parser names that differ from ours.
_MLX_LM_ALIASES = {"json_tools": ToolFormatName.HERMES}


class _TemplateOnly:
    """Just enough of a tokenizer for mlx-lm's `_infer_tool_parser`: the template, and no special vocabulary."""

    def __init__(self, chat_template: str) -> None:
        self.chat_template = chat_template

    def get_vocab(self) -> dict[str, int]:
        return {}


def _from_mlx_lm_name(name: str) -> ToolFormatName | None:
    if name in _MLX_LM_ALIASES:
        return _MLX_LM_ALIASES[name]
    try:
        return ToolFormatName(name)
    except ValueError:
        return None


def _infer_with_mlx_lm(chat_template: str) -> str | None:
    from mlx_lm.tokenizer_utils import _infer_tool_parser  # pyright: ignore[reportMissingTypeStubs, reportPrivateUsage, reportUnknownVariableType]

    inferred: object = _infer_tool_parser(_TemplateOnly(chat_template))
    return inferred if isinstance(inferred, str) else None


def detect_tool_format(
    chat_template: str | None, tool_parser_type: str | None = None, override: str | None = None
) -> ToolFormatName:
    """The format to parse this model's tool calls with.

    `override` (a user setting) wins and must name a format; then mlx-lm's `tool_parser_type` (from the
    tokenizer config); then mlx-lm's own inference from the chat template; then the families mlx-lm does not
    know (Llama 3.x `<|python_tag|>` JSON, Llama 3.2/4 pythonic, plain `<tool_call>`). A template with no
    tool syntax gets `generic` (hermes syntax, described to the model by us).
    """
    if override is not None:
        return ToolFormatName(override)
    if tool_parser_type is not None and (named := _from_mlx_lm_name(tool_parser_type)) is not None:
        return named
    if not chat_template:
        return ToolFormatName.GENERIC
    inferred = _infer_with_mlx_lm(chat_template)
    if inferred is not None and (named := _from_mlx_lm_name(inferred)) is not None:
        return named
    if "func_name1(" in chat_template or "[func_name(" in chat_template:
        return ToolFormatName.PYTHONIC
    if "<|python_tag|>" in chat_template or '"parameters": dictionary of argument name' in chat_template:
        return ToolFormatName.LLAMA3_JSON
    if "<tool_call>" in chat_template:
        return ToolFormatName.HERMES
    return ToolFormatName.GENERIC
