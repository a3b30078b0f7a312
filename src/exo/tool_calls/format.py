"""The one interface between the stream parser and a tool-call format (see the package docstring)."""

from dataclasses import dataclass
from typing import Protocol

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.reply import FormatGrammar


class CallSink(Protocol):
    """What a format reports while it reads a call region; implemented by the stream parser."""

    @property
    def paused(self) -> bool:
        """True right after `close_call` or `reject`: the region must return so the parser can account for it."""
        ...

    def find_tool(self, name: str) -> ToolSpec | None:
        """The tool called `name`, or None when the request has no such tool."""
        ...

    def open_call(self, tool: ToolSpec) -> None:
        """Commit a call: its name is known and valid. After this the call is never withdrawn."""
        ...

    def arguments(self, fragment: str) -> None:
        """Stream a fragment of the committed call's JSON arguments."""
        ...

    def close_call(self) -> None:
        """The committed call is complete (or as complete as it will get)."""
        ...

    def reject(self, reason: str) -> None:
        """Before commit: this is not a usable call; its raw text (markers included) becomes content."""
        ...

    def decline(self) -> None:
        """Before commit, in a reply with no call marker: the text only began like a call (a code fence, a JSON
        object of other keys, a markdown link) and is ordinary content, as `reject` gives it, but no failure."""
        ...

    def note_failure(self, reason: str) -> None:
        """After commit: something was wrong, but the call stands."""
        ...

    def content(self, text: str) -> None:
        """Text inside a call region that turned out to be ordinary content."""
        ...

    def reasoning(self, text: str) -> None:
        """Text a format marks as reasoning itself (harmony's analysis channel); content once the answer began."""
        ...

    def settle(self) -> None:
        """Before commit: the region's text so far was emitted (as content or reasoning) and will not be rejected,
        so no raw copy of it is kept."""
        ...


class CallRegion(Protocol):
    """Reads the text of one call region (after a start marker, or a bare call at the start of the reply)."""

    @property
    def finished(self) -> bool:
        """The region ended; the parser goes back to content at the position `feed` returned."""
        ...

    @property
    def handoff_marker(self) -> str | None:
        """A start marker the region consumed while ending: the parser opens a new region for it."""
        ...

    def feed(self, text: str, position: int) -> int:
        """Consume from `position`; return where it stopped (end of text, region end, or after close/reject)."""
        ...

    def finish(self) -> None:
        """Generation ended inside the region: reject (before commit) or close what was written (after)."""
        ...


@dataclass(frozen=True)
class HistoryNeeds:
    """What a format's chat template expects of history beyond OpenAI's message shape."""

    reasoning_field: str = "reasoning_content"
    """The assistant-message key the template reads earlier reasoning from (GPT-OSS's reads `thinking`)."""


class ToolFormat(Protocol):
    """A tool-call wire format: how its calls begin, a region reader for what follows, and its grammar."""

    @property
    def history(self) -> HistoryNeeds:
        """What its chat template needs of rendered history."""
        ...

    @property
    def grammar(self) -> FormatGrammar:
        """How replies in this format are written, for constrained generation."""
        ...

    @property
    def start_markers(self) -> tuple[str, ...]: ...

    @property
    def bare_openers(self) -> str:
        """Characters that may open a call with no marker, at the very start of the reply ("" if none)."""
        ...

    @property
    def frames_every_reply(self) -> bool:
        """Every reply is framed by the format's markers (harmony's channels), so they are read even when no tool
        may be called."""
        ...

    def open_region(self, marker: str, sink: CallSink, /) -> CallRegion:
        """A region that begins after `marker`."""
        ...

    def open_bare(self, sink: CallSink) -> CallRegion:
        """A region fed from the opener character itself (only called when `bare_openers` has it)."""
        ...


class MarkedFormat:
    """Defaults for a format whose calls always begin with one of its start markers."""

    bare_openers: str = ""
    frames_every_reply: bool = False
    history: HistoryNeeds = HistoryNeeds()

    def open_bare(self, sink: CallSink) -> CallRegion:
        raise NotImplementedError(f"{type(self).__name__} calls always start with a marker")
