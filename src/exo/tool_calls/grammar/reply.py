"""The one interface between a format and the grammar builder: how a reply in the format may look, per `ReplyShape`."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.lark import LarkWriter
from exo.tool_calls.grammar.spec import ReplyShape


@dataclass(frozen=True)
class ReplyRequest:
    shape: ReplyShape
    tools: tuple[ToolSpec, ...]
    parallel: bool


@dataclass(frozen=True)
class BareCalls:
    """Calls a format also writes with no marker at the start of a reply (see grammar/bare.py)."""

    expression: str
    """The calls, opening with one lexeme that spans the parser's whole bare-call test."""
    never_starting: tuple[str, ...]
    """Regex pieces free text may not start with: exactly the bare openings that are calls."""


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

    def bare_calls(self, lark: LarkWriter, request: ReplyRequest, /) -> BareCalls | None:
        """Calls written bare at the start of a free-text reply, where the format's parser reads them."""
        del lark, request
        return None

    def marked_opening_is_token(self, lark: LarkWriter) -> bool:
        return self._opening_pieces()[0] in lark.special_tokens

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
                bare = self.bare_calls(lark, request)
                never_starting = bare.never_starting if bare else self.never_starting
                prose = lark.prose(never_containing=openings, never_starting=never_starting)
                alternatives = [prose, *([bare.expression] if bare else [])]
                if not self.bare:
                    first, *rest = self._opening_pieces()
                    text = lark.text_until(first, "prose", never_starting=never_starting)
                    text_then_opening = " ".join([text, *map(lark.marker, rest)])
                    calls = lark.rule("calls", self.after_opening(lark, request))
                    released = self._released(lark, request, openings, calls)
                    alternatives.append(f"{text_then_opening} {calls} {released}")
                elif self.marked_opening_is_token(lark):
                    # A marked call list (LFM2's `<|tool_call_start|>[…]`) opens with an added token: no ambiguity.
                    alternatives.append(self._calls(lark, request))
                return " | ".join(alternatives)

    def _released(self, lark: LarkWriter, request: ReplyRequest, openings: Sequence[str], calls: str) -> str:
        """What may follow the calls under "auto": the grammar lets go, so the model may end or write text (a
        model that wanted a sentence after its call was otherwise pushed into a second call); where parallel calls
        are allowed, that text may open more `calls`, held again."""
        after = lark.prose(never_containing=openings)
        if not request.parallel:
            return after
        first, *rest = self._opening_pieces()
        text_then_opening = " ".join([lark.text_until(first, "text_after_call"), *map(lark.marker, rest)])
        return lark.recursive_rule("released", lambda name: f"{after} | {text_then_opening} {calls} {name}")


def repeated(lark: LarkWriter, one: str, separator: str, *, parallel: bool, hint: str = "more_calls") -> str:
    """`one`, then (when `parallel`) any number of `separator one`."""
    if not parallel:
        return one
    more = lark.rule(hint, f"{separator} {one}" if separator else one)
    return f"{one} {more}*"
