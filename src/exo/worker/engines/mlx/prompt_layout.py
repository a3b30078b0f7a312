"""Where a request's tool definitions go in the prompt: where the chat template puts them, or before the system text.

Most templates render the client's system text first and the tool block after it, in the same system turn (Qwen's:
`<|im_start|>system\\n{system}\\n\\n# Tools ...<|im_end|>`). A client whose system text changes with the project
folder (Claude Code names its working directory there) then changes the prompt before its whole tool list, so the
prefix cache cannot reuse the tools in another folder. Under `tools-first` the tool block comes first in that turn
and the system text after it, so requests with the same tools share them as a prefix.

The move is made only where it is exact: the template must render the system text verbatim, once, with the tool
block right after it and nothing before it that depends on the tools; otherwise the template's own order stays.
"""

from collections.abc import Callable
from typing import Final

from exo.worker.engines.mlx.chat_messages import TemplateMessage

# Stands for the system text while the template renders: no whitespace (templates trim) and nothing a template
# escapes or a client writes.
_SENTINEL: Final = "\u2063exo-system-text\u2063"

# Renders the messages with the template, with the request's tools (True) or without them (False).
Render = Callable[[list[TemplateMessage], bool], str]


def tools_first(render: Render, messages: list[TemplateMessage], in_template_order: str) -> str | None:
    """The prompt `in_template_order` (rendered with tools) with the tool block moved before the first message's
    system text, or None where the template does not render them so that the move is exact."""
    if not messages or messages[0]["role"] != "system":
        return None
    system = messages[0]["content"]
    if not isinstance(system, str) or not system or _SENTINEL in system:
        return None
    marked: list[TemplateMessage] = [{**messages[0], "content": _SENTINEL}, *messages[1:]]
    with_tools, without_tools = render(marked, True), render(marked, False)
    if with_tools.count(_SENTINEL) != 1 or without_tools.count(_SENTINEL) != 1:
        return None
    before, after = without_tools.split(_SENTINEL)
    before_with_tools, after_with_tools = with_tools.split(_SENTINEL)
    block = after_with_tools[: len(after_with_tools) - len(after)]
    if before_with_tools != before or not after_with_tools.endswith(after) or not block.strip():
        return None
    if with_tools.replace(_SENTINEL, system) != in_template_order:
        return None  # the template changes the system text (trims, escapes): the sentinel did not stand for it
    separator = block[: len(block) - len(block.lstrip())]
    return before + block.lstrip() + separator + system + after
