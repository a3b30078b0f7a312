"""The incremental tool-call stream parser: content / maybe-marker / in-call / in-reasoning.

It is fed each decoded text segment and emits typed chunks. Formats plug in through `plugin.ToolFormat`;
this module owns the decisions common to all of them (see the package docstring for the failure rule).
"""

import copy
from collections.abc import Callable, Sequence

from exo.shared.types.chunks import ParsedChunk, ReasoningChunk, TokenChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.common import ToolCallId, new_tool_call_id
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.arguments.schema import validation_errors
from exo.tool_calls.format import CallRegion
from exo.tool_calls.markers import MarkerScanner
from exo.tool_calls.names import ToolFormatName
from exo.tool_calls.registry import format_for

_WHITESPACE = " \t\n\r"


class _OpenCall:
    __slots__ = ("index", "parts", "tool")

    def __init__(self, tool: ToolSpec, index: int) -> None:
        self.tool = tool
        self.index = index
        self.parts: list[str] = []


class ToolStreamParser:
    """Turns generated text into content, reasoning and tool-call chunks, incrementally.

    `feed` each decoded segment as it is generated, then `finish` once at the end. Work is O(1) amortized
    per character: every scanner keeps its own position and never re-reads the buffer.
    """

    def __init__(
        self,
        tool_format: ToolFormatName,
        tools: Sequence[ToolSpec],
        *,
        parallel_tool_calls: bool = True,
        starts_in_reasoning: bool = False,
        reasoning_markers: tuple[str, str] | None = ("<think>", "</think>"),
        new_call_id: Callable[[], ToolCallId] = new_tool_call_id,
    ) -> None:
        self._format = format_for(tool_format)
        self._tools = {tool.name: tool for tool in tools}
        self._parallel = parallel_tool_calls
        self._new_call_id = new_call_id
        self._reasoning_start = reasoning_markers[0] if reasoning_markers else None
        markers = self._format.start_markers if self._tools or self._format.frames_every_reply else ()
        if self._reasoning_start is not None:
            markers = (*markers, self._reasoning_start)
        self._content_scanner = MarkerScanner(markers)
        self._reasoning_scanner = MarkerScanner(reasoning_markers[1:] if reasoning_markers else ())
        self._bare_openers = self._format.bare_openers if self._tools else ""
        self._in_reasoning = starts_in_reasoning and reasoning_markers is not None
        self._region: CallRegion | None = None
        self._raw: list[str] = []
        self._raw_active = False
        self._raw_reset = False
        self._give_back = False
        self._paused = False
        self._content_started = False
        self._pending_whitespace = ""
        self._stopped = False
        self._out: list[ParsedChunk] = []
        self._failures: list[str] = []
        self._emitted = 0
        self._call: _OpenCall | None = None
        self._call_failures = 0
        self.failed_call: tuple[str, str] | None = None
        """The name and raw arguments of the latest call when it failed after its name was read (None when the
        latest failure came before that)."""

    # ---- public ------------------------------------------------------------------------------------

    @property
    def tool_calls_emitted(self) -> int:
        """How many ToolCallChunks were emitted (finish_reason is "tool_calls" exactly when this is > 0)."""
        return self._emitted

    @property
    def should_stop(self) -> bool:
        """True once parallel_tool_calls=False and the first call is complete: generation can stop."""
        return self._stopped

    @property
    def call_failures(self) -> int:
        """How many calls failed so far: rejected before commit, or committed with arguments that do not parse or
        validate (what a repair re-decodes)."""
        return self._call_failures

    @property
    def in_call(self) -> bool:
        """Whether a call region is open: its text is being read as a (possible) call."""
        return self._region is not None

    @property
    def holding_marker_start(self) -> bool:
        """Whether content text is held back because it may be the beginning of a marker (a call's opening spelled
        in pieces, say): the text since the last release may still turn out to open a call."""
        return self._region is None and self._content_scanner.holding

    @property
    def open_call_name(self) -> str | None:
        """The tool of the call being written, once its name is read (committed)."""
        return self._call.tool.name if self._call is not None else None

    def snapshot(self) -> "ToolStreamParser":
        """An independent copy of the parser as it is now (to go back to), sharing the immutable tools and format."""
        shared: list[object] = [self._format, self._new_call_id, *self._tools.values()]
        return copy.deepcopy(self, memo={id(item): item for item in shared})

    @property
    def failures(self) -> list[str]:
        """Why anything fell back to content or was not quite right (for the runner's log)."""
        return list(self._failures)

    def feed(self, text: str) -> list[ParsedChunk]:
        """Consume one decoded segment; return the chunks it completes."""
        position = 0
        while position < len(text) and not self._stopped:
            if self._region is not None:
                position = self._feed_region(self._region, text, position)
            elif self._in_reasoning:
                result = self._reasoning_scanner.scan(text, position)
                self._emit_reasoning(result.released)
                self._in_reasoning = result.marker is None
                position = result.position
            else:
                position = self._feed_content(text, position)
        return self._drain()

    def finish(self) -> list[ParsedChunk]:
        """End of generation (EOS, stop sequence, or max_tokens): flush whatever is held."""
        if not self._stopped:
            if self._region is not None:
                self._paused = False
                self._region.finish()
                self._account_region(self._region, "")
            elif self._in_reasoning:
                self._emit_reasoning(self._reasoning_scanner.flush())
            else:
                self._emit_content(self._content_scanner.flush())
        if self._pending_whitespace and not self._emitted:
            self._out.append(TokenChunk(text=self._pending_whitespace))
        self._pending_whitespace = ""
        return self._drain()

    # ---- the CallSink interface (called by format regions) -------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    def find_tool(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def open_call(self, tool: ToolSpec) -> None:
        if self._stopped:
            return
        self._call = _OpenCall(tool, self._emitted)
        self.failed_call = None
        self._emitted += 1
        self._out.append(ToolCallChunk(index=self._call.index, call_id=self._new_call_id(), name=tool.name))
        self._raw_active = False
        self._raw.clear()
        self._pending_whitespace = ""

    def arguments(self, fragment: str) -> None:
        if fragment and self._call is not None and not self._stopped:
            self._out.append(ToolCallArgumentsChunk(index=self._call.index, fragment=fragment))
            self._call.parts.append(fragment)

    def close_call(self) -> None:
        call, self._call = self._call, None
        if call is None or self._stopped:
            return
        errors = validation_errors("".join(call.parts), call.tool.parameters)
        for error in errors:
            self._failures.append(f"tool call {call.index} ({call.tool.name}): {error}")
        if errors:
            self._call_failures += 1
            self.failed_call = (call.tool.name, "".join(call.parts))
        self._paused = True
        self._raw_reset = True
        self._stopped = not self._parallel

    def reject(self, reason: str) -> None:
        self._failures.append(reason)
        self._call_failures += 1
        self.failed_call = None
        self.decline()

    def decline(self) -> None:
        self._give_back = True
        self._paused = True

    def note_failure(self, reason: str) -> None:
        self._failures.append(reason)

    def content(self, text: str) -> None:
        self._emit_content(text)

    def reasoning(self, text: str) -> None:
        if self._answer_started:
            # Contract rule 10: reasoning comes first; later reasoning is kept, as content.
            self._emit_content(text)
        else:
            self._emit_reasoning(text)

    def settle(self) -> None:
        self._raw_active = False
        self._raw.clear()

    # ---- internals ---------------------------------------------------------------------------------

    @property
    def _answer_started(self) -> bool:
        """True once content (not just whitespace) or a tool call went out: reasoning can no longer open."""
        return self._content_started or self._emitted > 0

    def _drain(self) -> list[ParsedChunk]:
        out, self._out = self._out, []
        return out

    def _emit_content(self, text: str) -> None:
        # Whitespace-only runs wait for the next real content: next to a tool call they are markup.
        if not text:
            return
        body = text.rstrip(_WHITESPACE)
        if not body:
            self._pending_whitespace += text
            return
        self._out.append(TokenChunk(text=self._pending_whitespace + body))
        self._pending_whitespace = text[len(body) :]
        self._content_started = True

    def _emit_reasoning(self, text: str) -> None:
        if text:
            self._out.append(ReasoningChunk(text=text))

    def _feed_content(self, text: str, position: int) -> int:
        if self._bare_openers and not self._content_started and not self._content_scanner.holding:
            start = position
            while position < len(text) and text[position] in _WHITESPACE:
                position += 1
            self._emit_content(text[start:position])
            if position == len(text):
                return position
            if text[position] in self._bare_openers:
                self._open_region(self._format.open_bare(self), "")
                return position
        result = self._content_scanner.scan(text, position)
        self._emit_content(result.released)
        if result.marker is not None and result.marker == self._reasoning_start:
            if self._answer_started:
                # Contract rule 10: reasoning comes first. A think marker after the answer began is just text.
                self._emit_content(result.marker)
            else:
                self._in_reasoning = True
        elif result.marker is not None:
            self._open_region(self._format.open_region(result.marker, self), result.marker)
        return result.position

    def _open_region(self, region: CallRegion, marker: str) -> None:
        self._region = region
        self._raw = [marker] if marker else []
        self._raw_active = True

    def _feed_region(self, region: CallRegion, text: str, position: int) -> int:
        self._paused = False
        end = region.feed(text, position)
        self._account_region(region, text[position:end])
        return end

    def _account_region(self, region: CallRegion, consumed: str) -> None:
        """After a region step: keep the raw text of an uncommitted call, or give it back as content."""
        if self._raw_reset:
            self._raw_reset = False
            self._raw_active = True
            self._raw.clear()
        elif self._raw_active:
            self._raw.append(consumed)
        if self._give_back:
            self._give_back = False
            raw = "".join(self._raw)
            self._raw.clear()
            self._raw_active = False
            self._region = None
            self._emit_content(raw)
            self._content_started = True
        elif region.finished:
            self._region = None
            self._raw_active = False
            if region.handoff_marker is not None:
                self._open_region(self._format.open_region(region.handoff_marker, self), region.handoff_marker)
