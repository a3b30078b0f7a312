"""The grammar of a tagged format (see regions/tagged_calls.py), written in its template's canonical layout."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.lark import LarkWriter
from exo.tool_calls.grammar.parameters import (
    Parameter,
    any_parameters,
    json_value,
    parameter_sequence,
    text_value,
    tool_parameters,
)
from exo.tool_calls.grammar.reply import OpenedCallsGrammar, ReplyRequest, repeated


class Pattern(str):
    """A layout piece that is a regex (lark `/…/`), such as a call's running index."""

    __slots__ = ()


Pieces = Sequence[str]
"""Texts written in order; a text that is an added token of the model is written as that token; a `Pattern` is a
regex."""


@dataclass(frozen=True)
class TagLayout:
    """How one family's template writes a call, piece by piece."""

    label: str
    opening: str
    """The format's start marker: opens a section of calls, or (with `section_close` None) one call."""
    markers: tuple[str, ...]
    """Every piece that may be an added token of the model."""
    call_head: Callable[[str], Pieces]
    """From the call's opening tag through its header, for a tool name."""
    parameter_head: Callable[[str, bool], Pieces]
    """A parameter's opening tag(s) for its name, and whether its value is written as raw text."""
    parameter_close: str
    after_parameter: Pieces
    call_tail: Pieces
    between_calls: Pieces = ()
    section_head: Pieces = ()
    section_close: Pieces = ()
    opening_pieces: tuple[str, ...] = ()
    """`opening` as the added tokens it is made of, where it is several (Kimi K3's `<|open|>tools<|sep|>`)."""


class TaggedGrammar(OpenedCallsGrammar):
    """Calls in `layout`; parameters in schema order (see grammar/parameters.py)."""

    def __init__(self, layout: TagLayout) -> None:
        self._layout = layout
        self.opening = layout.opening
        self.opening_pieces = layout.opening_pieces
        self.markers = layout.markers

    def _pieces(self, lark: LarkWriter, pieces: Pieces) -> str:
        return " ".join(f"/{piece}/" if isinstance(piece, Pattern) else lark.marker(piece) for piece in pieces if piece)

    def after_opening(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        layout = self._layout
        calls = " | ".join(lark.rule(f"call_{tool.name}", self._call(lark, tool)) for tool in request.tools)
        one = lark.rule("call", f"({calls}) {self._pieces(lark, layout.call_tail)}")
        if not layout.section_close:
            # Each call opens with the start marker again.
            separator = self._pieces(lark, (*layout.between_calls, *(layout.opening_pieces or (layout.opening,))))
            return repeated(lark, one, separator, parallel=request.parallel)
        listed = repeated(lark, one, self._pieces(lark, layout.between_calls), parallel=request.parallel)
        return f"{self._pieces(lark, layout.section_head)} {listed} {self._pieces(lark, layout.section_close)}"

    def _call(self, lark: LarkWriter, tool: ToolSpec) -> str:
        layout = self._layout
        head = self._pieces(lark, layout.call_head(tool.name))
        parameters = tool_parameters(tool, layout.label)
        if parameters is None:
            return f"{head} {any_parameters(lark, lambda name: self._any_parameter(lark, name))}"
        return f"{head} {parameter_sequence(lark, parameters, lambda parameter: self._parameter(lark, parameter))}"

    def _parameter(self, lark: LarkWriter, parameter: Parameter) -> str:
        layout = self._layout
        head = self._pieces(lark, layout.parameter_head(parameter.name, parameter.is_text))
        tail = self._pieces(lark, layout.after_parameter)
        if parameter.is_text:
            return f"{head} {text_value(lark, parameter, layout.parameter_close, layout.label)} {tail}"
        return f"{head} {json_value(lark, parameter)} {lark.marker(layout.parameter_close)} {tail}"

    def _any_parameter(self, lark: LarkWriter, name: str) -> str:
        """A parameter whose name the schema does not fix: the layout's head around a free name, raw text."""
        layout = self._layout
        placeholder = "\x00"
        pieces = list(layout.parameter_head(placeholder, True))
        head = " ".join(
            name if piece == placeholder else lark.marker(piece) for piece in _split_around(pieces, placeholder)
        )
        value = lark.text_until(layout.parameter_close, "value")
        return f"{head} {value} {self._pieces(lark, layout.after_parameter)}"


def _split_around(pieces: Sequence[str], placeholder: str) -> list[str]:
    """Pieces with the placeholder made a piece of its own (it may sit inside a text piece)."""
    result: list[str] = []
    for piece in pieces:
        parts = piece.split(placeholder)
        for index, part in enumerate(parts):
            if index:
                result.append(placeholder)
            if part:
                result.append(part)
    return result
