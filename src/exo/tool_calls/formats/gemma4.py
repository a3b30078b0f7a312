"""Gemma 4 (`<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`) and FunctionGemma (the same with
`<start_function_call>`, `<end_function_call>` and `<escape>` as the string quote), one call per marker."""

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.lark import LarkWriter, literal
from exo.tool_calls.grammar.parameters import (
    Parameter,
    any_parameters,
    json_value,
    parameter_sequence,
    text_value,
    tool_parameters,
)
from exo.tool_calls.grammar.reply import OpenedCallsGrammar, ReplyRequest, repeated
from exo.tool_calls.regions.braced_call import BracedCallRegion, BracedSyntax


class BracedGrammar(OpenedCallsGrammar):
    def __init__(self, start: str, syntax: BracedSyntax, label: str) -> None:
        self.opening = start
        self.markers = (start, syntax.end, syntax.quote)
        self._syntax = syntax
        self._label = label

    def after_opening(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        calls = " | ".join(lark.rule(f"call_{tool.name}", self._call(lark, tool)) for tool in request.tools)
        one = lark.rule("call", f"({calls}) {lark.marker(self._syntax.end)}")
        return repeated(lark, one, lark.marker(self.opening), parallel=request.parallel)

    def _call(self, lark: LarkWriter, tool: ToolSpec) -> str:
        parameters = tool_parameters(tool, self._label)
        comma = literal(",")
        if parameters is None:
            quote = lark.marker(self._syntax.quote)
            arguments = any_parameters(
                lark,
                lambda name: f"{name} {literal(':')} {quote} {lark.text_until(self._syntax.quote, 'value')}",
                separator=comma,
            )
        else:
            arguments = parameter_sequence(lark, parameters, lambda parameter: self._parameter(lark, parameter), comma)
        return f"{literal(f'call:{tool.name}' + '{')} {arguments} {literal('}')}"

    def _parameter(self, lark: LarkWriter, parameter: Parameter) -> str:
        key = literal(f"{parameter.name}:")
        if parameter.is_text:
            quote = self._syntax.quote
            return f"{key} {lark.marker(quote)} {text_value(lark, parameter, quote, self._label)}"
        return f"{key} {json_value(lark, parameter)}"


class BracedFormat(MarkedFormat):
    def __init__(self, start: str, end: str, quote: str, label: str) -> None:
        self._syntax = BracedSyntax(quote=quote, end=end)
        self.start_markers: tuple[str, ...] = (start,)
        self.grammar = BracedGrammar(start, self._syntax, label)

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return BracedCallRegion(sink, self._syntax)


GEMMA4 = BracedFormat("<|tool_call>", "<tool_call|>", '<|"|>', "gemma4")
FUNCTION_GEMMA = BracedFormat("<start_function_call>", "<end_function_call>", "<escape>", "function_gemma")
