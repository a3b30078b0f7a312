"""The Anthropic Messages streaming grammar as a checker, with the `anthropic` SDK's accumulator as second reader
where that SDK is installed (a development dependency: a runtime-only install checks the grammar alone).

A stream is: `message_start`; per content block `content_block_start` (index 0, 1, 2…, one block open at a time,
starting empty), its deltas (text_delta in text blocks, thinking_delta in thinking blocks, input_json_delta in
tool_use blocks, whose fragments join to a JSON object), `content_block_stop`; then `message_delta` with the stop
reason ("tool_use" exactly when tool_use blocks were sent) and usage; then `message_stop`. A failure is one
`error` event, last. Each SSE event name must equal its data's `type`.
"""

from exo.conformance.contract import StreamedCall, Violation
from exo.conformance.json_view import JsonMapping, as_int, as_object, parses_as_json_object
from exo.conformance.optional_sdk import ProtocolReader, optional_reader
from exo.conformance.protocol_check import ProtocolCheck, ProtocolSummary, check_protocol_stream

_DELTA_FOR_BLOCK = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
_DELTA_FIELD = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


class _Block:
    def __init__(self, kind: str, call_id: str = "", name: str = "") -> None:
        self.kind = kind
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []


class _MessagesWalker:
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.blocks: list[_Block] = []
        self.open: _Block | None = None
        self.stop: str | None = None
        self.errored = False
        self.names: list[str] = []

    def violate(self, rule: str, message: str) -> None:
        self.violations.append(Violation(rule=f"messages:{rule}", message=message))

    def read(self, position: int, name: str | None, data: JsonMapping) -> None:
        kind = data.get("type")
        if name != kind:
            self.violate("event-name", f"event {position} is named {name!r} but its type is {kind!r}")
        if self.errored or (self.names and self.names[-1] == "message_stop"):
            self.violate("order", f"event {position} ({kind}) follows the end of the stream")
        self.names.append(str(kind))
        if position == 0 and kind != "message_start":
            self.violate("order", f"the first event is {kind!r}, not message_start")
        match kind:
            case "content_block_start":
                self._start(position, data)
            case "content_block_delta":
                self._delta(position, data)
            case "content_block_stop":
                if self.open is None or data.get("index") != len(self.blocks) - 1:
                    self.violate("blocks", f"event {position} stops block {data.get('index')}, which is not open")
                self.open = None
            case "message_delta":
                self._message_delta(position, data)
            case "error":
                self.errored = True
            case "message_start" | "message_stop" | "ping":
                pass
            case _:
                self.violate("event-name", f"event {position} has the unknown type {kind!r}")

    def _start(self, position: int, data: JsonMapping) -> None:
        block = as_object(data.get("content_block")) or {}
        if self.open is not None:
            self.violate("blocks", f"event {position} starts a block while block {len(self.blocks) - 1} is open")
        if data.get("index") != len(self.blocks):
            self.violate("blocks", f"event {position} starts block {data.get('index')}, expected {len(self.blocks)}")
        kind = str(block.get("type"))
        if kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                self.violate("block-start", f"event {position}: a tool_use block needs a non-empty id and name")
            if block.get("input") != {}:
                self.violate("block-start", f"event {position}: a tool_use block starts with input {{}}")
            self.open = _Block(kind, str(call_id), str(name))
        elif kind in ("text", "thinking"):
            if block.get(kind) != "":
                self.violate("block-start", f"event {position}: a {kind} block starts empty")
            self.open = _Block(kind)
        else:
            self.violate("block-start", f"event {position}: unknown block type {kind!r}")
            self.open = _Block(kind)
        self.blocks.append(self.open)

    def _delta(self, position: int, data: JsonMapping) -> None:
        delta = as_object(data.get("delta")) or {}
        if self.open is None or data.get("index") != len(self.blocks) - 1:
            self.violate("blocks", f"event {position} writes to block {data.get('index')}, which is not open")
            return
        kind = delta.get("type")
        if kind != _DELTA_FOR_BLOCK.get(self.open.kind):
            self.violate("delta-kind", f"event {position}: a {kind!r} delta in a {self.open.kind} block")
            return
        text = delta.get(_DELTA_FIELD[str(kind)])
        if not isinstance(text, str):
            self.violate("delta-kind", f"event {position}: the {kind} delta carries no string")
            return
        self.open.parts.append(text)

    def _message_delta(self, position: int, data: JsonMapping) -> None:
        if self.open is not None:
            self.violate("blocks", f"event {position}: message_delta while block {len(self.blocks) - 1} is open")
        stop = (as_object(data.get("delta")) or {}).get("stop_reason")
        self.stop = stop if isinstance(stop, str) else None
        usage = as_object(data.get("usage")) or {}
        if as_int(usage.get("output_tokens")) is None or as_int(usage.get("input_tokens")) is None:
            self.violate("usage", f"event {position}: message_delta usage lacks integer input_tokens/output_tokens")

    def finish(self) -> ProtocolCheck:
        if not self.errored:
            if self.names[-2:] != ["message_delta", "message_stop"]:
                self.violate("order", f"the stream ends with {self.names[-2:]}, not message_delta, message_stop")
            calls = [block for block in self.blocks if block.kind == "tool_use"]
            if self.stop != "max_tokens" and (self.stop == "tool_use") != bool(calls):
                self.violate("stop-reason", f"stop_reason {self.stop!r} with {len(calls)} tool_use block(s)")
            for index, block in enumerate(calls):
                if self.stop != "max_tokens" and not parses_as_json_object("".join(block.parts)):
                    self.violate(
                        "tool-input-json", f"tool_use {index}: the input_json_delta fragments are not an object"
                    )
        return ProtocolCheck(summary=self.summary(), violations=tuple(self.violations))

    def summary(self) -> ProtocolSummary:
        calls = [block for block in self.blocks if block.kind == "tool_use"]
        return ProtocolSummary(
            content="".join("".join(block.parts) for block in self.blocks if block.kind == "text"),
            reasoning="".join("".join(block.parts) for block in self.blocks if block.kind == "thinking"),
            calls=tuple(
                StreamedCall(index=index, call_id=block.call_id, name=block.name, arguments="".join(block.parts))
                for index, block in enumerate(calls)
            ),
            stop=self.stop,
            errored=self.errored,
        )


def anthropic_reader() -> ProtocolReader | None:
    """The `anthropic` SDK's accumulator as a second reader, or None where the SDK is not installed."""

    def load() -> ProtocolReader:
        from exo.conformance.anthropic_crosscheck import anthropic_violations

        return anthropic_violations

    return optional_reader("anthropic", load)


def check_messages_stream(body: str) -> ProtocolCheck:
    """Every grammar violation of one Messages API SSE body, plus any disagreement of the SDK's accumulator (where
    `anthropic` is installed)."""
    return check_protocol_stream(body, _MessagesWalker(), anthropic_reader(), lambda summary: not summary.errored)
