"""The OpenAI Responses streaming grammar as a checker, with the `openai` SDK's stream state as second reader where
that SDK is installed (a development dependency: a runtime-only install checks the grammar alone).

A stream is numbered by `sequence_number` from 0; it opens with `response.created` and `response.in_progress` and
ends with `response.completed`, `response.incomplete` or `response.failed`, all carrying the same response id.
Between them output items are announced (`response.output_item.added`, output_index 0, 1, 2…, one open at a
time, announced empty), written (deltas naming the open item) and closed (`…done` events whose full text equals
the joined deltas, then `response.output_item.done`). A function call's argument fragments join to a JSON object.
The final response lists every item as it was closed.
"""

from exo.conformance.contract import StreamedCall, Violation
from exo.conformance.json_view import JsonMapping, as_int, as_list, as_object, parses_as_json_object
from exo.conformance.optional_sdk import ProtocolReader, optional_reader
from exo.conformance.protocol_check import ProtocolCheck, ProtocolSummary, check_protocol_stream

_FINAL = ("response.completed", "response.incomplete", "response.failed")
_TEXT_DELTAS = {"response.output_text.delta": "message", "response.reasoning_text.delta": "reasoning"}
_TEXT_DONES = {"response.output_text.done": "message", "response.reasoning_text.done": "reasoning"}


class _Item:
    def __init__(self, item: JsonMapping) -> None:
        self.kind = str(item.get("type"))
        self.item_id = item.get("id")
        self.call_id = str(item.get("call_id", ""))
        self.name = str(item.get("name", ""))
        self.parts: list[str] = []
        self.done: JsonMapping | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)


class _ResponsesWalker:
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.items: list[_Item] = []
        self.open: _Item | None = None
        self.response_id: object = None
        self.final: JsonMapping | None = None
        self.final_type: str | None = None

    def violate(self, rule: str, message: str) -> None:
        self.violations.append(Violation(rule=f"responses:{rule}", message=message))

    def read(self, position: int, name: str | None, data: JsonMapping) -> None:
        kind = str(data.get("type"))
        if name != kind:
            self.violate("event-name", f"event {position} is named {name!r} but its type is {kind!r}")
        if as_int(data.get("sequence_number")) != position:
            self.violate("sequence", f"event {position} has sequence_number {data.get('sequence_number')!r}")
        if self.final is not None:
            self.violate("lifecycle", f"event {position} ({kind}) follows {self.final_type}")
        if kind.startswith("response.") and "response" in data:
            self._lifecycle(position, kind, as_object(data.get("response")) or {})
        elif kind == "response.output_item.added":
            self._added(position, as_object(data.get("item")) or {}, data)
        elif self.open is None or data.get("item_id", self.open.item_id) != self.open.item_id:
            self.violate("items", f"event {position} ({kind}) does not name the open item")
        elif data.get("output_index") != len(self.items) - 1:
            self.violate("items", f"event {position} ({kind}) has output_index {data.get('output_index')!r}")
        else:
            self._item_event(position, kind, data, self.open)

    def _lifecycle(self, position: int, kind: str, response: JsonMapping) -> None:
        expected = ("response.created", "response.in_progress")
        if position < 2 and kind != expected[position]:
            self.violate("lifecycle", f"event {position} is {kind}, expected {expected[position]}")
        if self.response_id is None:
            self.response_id = response.get("id")
        elif response.get("id") != self.response_id:
            self.violate("lifecycle", f"event {position}: the response id changed")
        if kind in _FINAL:
            self.final, self.final_type = response, kind

    def _added(self, position: int, item: JsonMapping, data: JsonMapping) -> None:
        if self.open is not None:
            self.violate("items", f"event {position} adds an item while item {len(self.items) - 1} is open")
        if data.get("output_index") != len(self.items):
            self.violate(
                "items", f"event {position} adds output_index {data.get('output_index')}, expected {len(self.items)}"
            )
        empty = (
            item.get("arguments") == "" and bool(item.get("call_id")) and bool(item.get("name"))
            if item.get("type") == "function_call"
            else as_list(item.get("content")) == []
        )
        if not empty:
            self.violate("added-empty", f"event {position}: an item is announced empty (got {dict(item)})"[:300])
        self.open = _Item(item)
        self.items.append(self.open)

    def _item_event(self, position: int, kind: str, data: JsonMapping, item: _Item) -> None:
        if kind in _TEXT_DELTAS or kind == "response.function_call_arguments.delta":
            wanted = _TEXT_DELTAS.get(kind, "function_call")
            if item.kind != wanted or not isinstance(data.get("delta"), str):
                self.violate("delta-kind", f"event {position}: a {kind} for a {item.kind} item")
                return
            item.parts.append(str(data["delta"]))
        elif kind in _TEXT_DONES or kind == "response.function_call_arguments.done":
            full = data.get("arguments") if kind.endswith("arguments.done") else data.get("text")
            if full != item.text:
                self.violate(
                    "done-text", f"event {position}: {kind} says {full!r}, the deltas said {item.text!r}"[:300]
                )
        elif kind == "response.output_item.done":
            item.done = as_object(data.get("item")) or {}
            if item.done.get("id") != item.item_id:
                self.violate("items", f"event {position}: output_item.done for another item")
            self.open = None
        elif kind not in ("response.content_part.added", "response.content_part.done"):
            self.violate("event-name", f"event {position} has the unknown type {kind!r}")

    def finish(self) -> ProtocolCheck:
        if self.final is None:
            self.violate("lifecycle", "the stream does not end with response.completed, incomplete or failed")
        elif self.final_type != "response.failed":
            if self.open is not None:
                self.violate("items", f"item {len(self.items) - 1} was never closed")
            final_ids = [(as_object(item) or {}).get("id") for item in as_list(self.final.get("output")) or []]
            if final_ids != [item.item_id for item in self.items]:
                self.violate("final-output", "the final response does not list the streamed items in order")
            usage = as_object(self.final.get("usage")) or {}
            if any(as_int(usage.get(key)) is None for key in ("input_tokens", "output_tokens", "total_tokens")):
                self.violate("usage", "the final response lacks integer input_tokens/output_tokens/total_tokens")
            completed = self.final_type == "response.completed"
            for index, item in enumerate(self.items):
                if completed and item.kind == "function_call" and not parses_as_json_object(item.text):
                    self.violate("arguments-json", f"function_call {index}: the arguments are not a JSON object")
        return ProtocolCheck(summary=self.summary(), violations=tuple(self.violations))

    def summary(self) -> ProtocolSummary:
        calls = [item for item in self.items if item.kind == "function_call"]
        return ProtocolSummary(
            content="".join(item.text for item in self.items if item.kind == "message"),
            reasoning="".join(item.text for item in self.items if item.kind == "reasoning"),
            calls=tuple(
                StreamedCall(index=index, call_id=item.call_id, name=item.name, arguments=item.text)
                for index, item in enumerate(calls)
            ),
            stop=self.final_type,
            errored=self.final_type == "response.failed",
        )


def responses_reader() -> ProtocolReader | None:
    """The `openai` SDK's Responses stream state as a second reader, or None where the SDK is not installed."""

    def load() -> ProtocolReader:
        from exo.conformance.responses_crosscheck import responses_violations

        return responses_violations

    return optional_reader("openai", load)


def check_responses_stream(body: str) -> ProtocolCheck:
    """Every grammar violation of one Responses API SSE body, plus any disagreement of the SDK's stream state (where
    `openai` is installed)."""
    return check_protocol_stream(
        body, _ResponsesWalker(), responses_reader(), lambda summary: summary.stop == "response.completed"
    )
