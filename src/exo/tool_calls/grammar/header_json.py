"""The grammar of a header + JSON format (see regions/header_json.py), in its template's layout."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exo.tool_calls.grammar.lark import LarkWriter
from exo.tool_calls.grammar.reply import OpenedCallsGrammar, ReplyRequest, repeated


@dataclass(frozen=True)
class HeaderJsonLayout:
    opening: str
    markers: tuple[str, ...]
    call_open: str
    header: Callable[[str], str]
    """The header for a tool name, as lark (Kimi K2: `"functions.NAME:" /[0-9]+/`)."""
    arguments_open: str
    call_close: str
    section_close: str


class HeaderJsonGrammar(OpenedCallsGrammar):
    def __init__(self, layout: HeaderJsonLayout) -> None:
        self._layout = layout
        self.opening = layout.opening
        self.markers = layout.markers

    def after_opening(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        layout = self._layout
        alternatives: Sequence[str] = [
            lark.rule(
                f"call_{tool.name}",
                f"{layout.header(tool.name)} {lark.marker(layout.arguments_open)} "
                f"{lark.arguments(tool.parameters, every_keyword_enforced=bool(tool.strict))}",
            )
            for tool in request.tools
        ]
        one = lark.rule(
            "call", f"{lark.marker(layout.call_open)} ({' | '.join(alternatives)}) {lark.marker(layout.call_close)}"
        )
        return f"{repeated(lark, one, '', parallel=request.parallel)} {lark.marker(layout.section_close)}"
