"""Emitting calls parsed whole: all of them through the sink, or none."""

import json
from collections.abc import Sequence

from exo.tool_calls.arguments.json_stream import JsonValueStreamer
from exo.tool_calls.arguments.parsed_call import ParsedCall
from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.format import CallSink


def emit_parsed_calls(sink: CallSink, calls: Sequence[ParsedCall]) -> str | None:
    """Emit every call, or none: returns why they were refused (an unknown name), else None.

    The arguments go through the same schema-aware scanner as streamed ones, so coercion is identical.
    """
    if not calls:
        return "no call found"
    tools = [sink.find_tool(call.name) for call in calls]
    for call, tool in zip(calls, tools, strict=True):
        if tool is None:
            return f"unknown tool {call.name!r}"
    for call, tool in zip(calls, tools, strict=True):
        assert tool is not None
        sink.open_call(tool)
        text = json.dumps(call.arguments, ensure_ascii=False)
        streamer = JsonValueStreamer(SchemaView.of_tool(tool.parameters))
        streamer.feed(text, 0)
        sink.arguments(streamer.take())
        sink.close_call()
    return None
