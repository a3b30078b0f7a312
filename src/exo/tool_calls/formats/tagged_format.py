"""A format built from tag pieces: the parser's syntax and the grammar's layout (see regions/tagged_calls.py)."""

from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.tagged import TaggedGrammar, TagLayout
from exo.tool_calls.regions.tagged_calls import TaggedCallsRegion, TagSyntax


class TaggedFormat(MarkedFormat):
    """Calls opened by `layout.opening`; a section of calls when the layout has a section close, else one call."""

    def __init__(self, syntax: TagSyntax, layout: TagLayout) -> None:
        self._syntax = syntax
        self._in_section = bool(layout.section_close)
        self.start_markers: tuple[str, ...] = (layout.opening,)
        self.grammar = TaggedGrammar(layout)

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return TaggedCallsRegion(sink, self._syntax, in_section=self._in_section)
