"""Formats mlx-lm already parses (GLM 4.7, Kimi K2/K3, MiniMax M2, Gemma 4, FunctionGemma, …): the text between
the module's start and end markers is handed to `mlx_lm.tool_parsers.<module>.parse_tool_call` when the call
closes (or generation ends), and every call it yields is emitted whole, or none and the text is content."""

import importlib
from collections.abc import Callable
from typing import cast

from exo.tool_calls.arguments.parsed_call import emit_parsed_calls, parsed_calls_from_untyped
from exo.tool_calls.format import CallRegion, CallSink
from exo.tool_calls.grammar.lark import LarkWriter
from exo.tool_calls.grammar.reply import ReplyRequest, ReplyShape
from exo.tool_calls.grammar.spec import UnsupportedConstraintError
from exo.tool_calls.markers import MarkerScanner

UntypedParser = Callable[[str, object], object]


class _MlxLmModule:
    """The three names every mlx-lm tool-parser module exposes, typed."""

    def __init__(self, module_name: str) -> None:
        module = importlib.import_module(f"mlx_lm.tool_parsers.{module_name}")
        self.start = cast(str, module.tool_call_start)
        self.end = cast(str, module.tool_call_end)
        self.parse = cast(UntypedParser, module.parse_tool_call)


class MlxLmRegion:
    """Captures one call region to its end marker, then parses it with mlx-lm."""

    def __init__(self, sink: CallSink, module: _MlxLmModule) -> None:
        self._sink = sink
        self._module = module
        self._scanner = MarkerScanner((module.end,), sink.meter)
        self._parts: list[str] = []
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def handoff_marker(self) -> str | None:
        return None

    def feed(self, text: str, position: int) -> int:
        result = self._scanner.scan(text, position)
        self._parts.append(result.released)
        if result.marker is not None:
            self._parse()
        return result.position

    def finish(self) -> None:
        """Models often end with EOS instead of the end marker: parse what there is."""
        self._parts.append(self._scanner.flush())
        self._parse()

    def _parse(self) -> None:
        self._finished = True
        # mlx-lm's parsers read parameter types from the tool list, in OpenAI's shape.
        tools = [{"type": "function", "function": tool.model_dump()} for tool in self._sink.all_tools()]
        try:
            calls = parsed_calls_from_untyped(self._module.parse("".join(self._parts), tools))
        except Exception as error:  # mlx-lm parsers raise anything from ValueError to AttributeError
            self._sink.reject(f"{type(error).__name__}: {error}"[:300])
            return
        reason = emit_parsed_calls(self._sink, calls)
        if reason is not None:
            self._sink.reject(reason)


class _TextOnlyGrammar:
    """No call rules yet: only `tool_choice: "none"` (text that never writes the start marker) is enforced."""

    def __init__(self, module: Callable[[], _MlxLmModule]) -> None:
        self._module = module

    @property
    def marker_texts(self) -> tuple[str, ...]:
        return (self._module().start,)

    def reply(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        if request.shape is not ReplyShape.TEXT_ONLY:
            raise UnsupportedConstraintError("this tool format has no constraint grammar for calls")
        return lark.prose(never_containing=(self._module().start,))


class MlxLmFormat:
    """A format backed by one mlx-lm tool-parser module (imported on first use: mlx-lm is slow to import)."""

    bare_openers: str = ""

    def __init__(self, module_name: str) -> None:
        self._module_name = module_name
        self._module: _MlxLmModule | None = None
        self.grammar = _TextOnlyGrammar(self._loaded)

    def _loaded(self) -> _MlxLmModule:
        if self._module is None:
            self._module = _MlxLmModule(self._module_name)
        return self._module

    @property
    def start_markers(self) -> tuple[str, ...]:
        return (self._loaded().start,)

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return MlxLmRegion(sink, self._loaded())

    def open_bare(self, sink: CallSink) -> CallRegion:
        raise NotImplementedError("mlx-lm formats always start with a marker")
