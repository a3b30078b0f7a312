"""The one interface between a format and the grammar builder: how a reply in the format may look, per mode."""

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from exo.shared.types.api import FunctionDefinition
from exo.tool_calls.grammar.lark import LarkWriter


class ReplyShape(StrEnum):
    """What the reply may be."""

    CALLS = "calls"
    """One or more calls (one when `parallel` is False), nothing else."""
    TEXT_OR_CALLS = "text_or_calls"
    """Free text, or calls; text never carries a call past the grammar (an opened call is checked)."""
    TEXT_ONLY = "text_only"
    """Free text that never opens a call."""
    ANSWER_OR_CALLS = "answer_or_calls"
    """The JSON answer (rule `answer`), or calls in its place."""


@dataclass(frozen=True)
class ReplyRequest:
    shape: ReplyShape
    tools: tuple[FunctionDefinition, ...]
    parallel: bool


class FormatGrammar(Protocol):
    """A format's grammar: the markers it writes and the `reply` expression for a request."""

    @property
    def marker_texts(self) -> tuple[str, ...]:
        """Texts the grammar writes as markers: the caller looks up which are single added tokens."""
        ...

    def reply(self, lark: LarkWriter, request: ReplyRequest, /) -> str: ...


class OpenedCallsGrammar:
    """A format whose calls begin with a marker (`opening`); subclasses write what follows it.

    `bare` formats write the opening only at the very start of the reply (Llama's pythonic `[f(x=1)]`), so text
    before a call is impossible there. `never_starting` lists regex pieces of marker-less call forms the parser
    also reads at the start of a reply: text may not begin with them.
    """

    opening: str = ""
    opening_pieces: tuple[str, ...] = ()
    """The opening as the pieces the model writes it in, when it is made of several added tokens."""
    markers: tuple[str, ...] = ()
    also_opening: tuple[str, ...] = ()
    never_starting: tuple[str, ...] = ()
    bare: bool = False
    never_in_text: tuple[str, ...] = ()
    """More texts free text may not contain, beyond the openings: near-misses of the call markup that a model
    told not to call writes instead (the default model answered "none" with `<tool_call name="…">`, then with
    `<tool_output>`)."""

    @property
    def marker_texts(self) -> tuple[str, ...]:
        return self.markers

    def after_opening(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        """Everything a call section holds after its opening marker (every call, one when not parallel)."""
        raise NotImplementedError

    def _opening_pieces(self) -> tuple[str, ...]:
        return self.opening_pieces or (self.opening,)

    def opening_expression(self, lark: LarkWriter) -> str:
        return " ".join(lark.marker(piece) for piece in self._opening_pieces())

    def _calls(self, lark: LarkWriter, request: ReplyRequest) -> str:
        return f"{self.opening_expression(lark)} {self.after_opening(lark, request)}"

    def reply(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        openings = (self.opening, *self.also_opening) if not self.bare else self.also_opening
        match request.shape:
            case ReplyShape.CALLS:
                return self._calls(lark, request)
            case ReplyShape.ANSWER_OR_CALLS:
                return f"answer | {self._calls(lark, request)}"
            case ReplyShape.TEXT_ONLY:
                return lark.prose(never_containing=(*openings, *self.never_in_text), never_starting=self.never_starting)
            case ReplyShape.TEXT_OR_CALLS:
                if self.bare:
                    # Text may not even begin like a call: a greedy text lexeme cannot give way to one later.
                    prose = lark.prose(never_containing=openings, never_starting=(re.escape(self.opening),))
                    return f"{prose} | {self._calls(lark, request)}"
                prose = lark.prose(never_containing=openings, never_starting=self.never_starting)
                first, *rest = self._opening_pieces()
                text_then_opening = " ".join([lark.text_until(first, "prose"), *map(lark.marker, rest)])
                return f"{prose} | {text_then_opening} {self.after_opening(lark, request)}"


def repeated(lark: LarkWriter, one: str, separator: str, *, parallel: bool, hint: str = "more_calls") -> str:
    """`one`, then (when `parallel`) any number of `separator one`."""
    if not parallel:
        return one
    more = lark.rule(hint, f"{separator} {one}" if separator else one)
    return f"{one} {more}*"
