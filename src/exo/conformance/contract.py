"""The streaming contract of docs/TOOL_CALLING.md as a checker over one response's SSE payloads.

`walk_stream` reads the `data:` payloads in order (the JSON texts and the final `[DONE]`), accumulates what a
client would (role, content, reasoning, tool calls, finish reason) and lists every rule the stream breaks.
Rules are named after the contract's numbered points, so a violation says which promise was broken.
"""

import json
import re
from collections.abc import Sequence

from exo.conformance.json_view import JsonMapping, as_int, as_list, as_object, parses_as_json, parses_as_json_object
from exo.shared.types.common import FrozenModel

DONE_PAYLOAD = "[DONE]"
TOOL_CALL_ID_PATTERN = re.compile(r"^call_[A-Za-z0-9]{24}$")
_FINISH_REASONS = frozenset({"stop", "length", "tool_calls"})
_FIRST_CALL_KEYS = frozenset({"index", "id", "type", "function"})
_USAGE_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


class Violation(FrozenModel):
    """One broken promise: `rule` names the contract point, `message` says where and how."""

    rule: str
    message: str


class StreamedCall(FrozenModel):
    """A tool call as a client accumulates it from the stream."""

    index: int
    call_id: str
    name: str
    arguments: str


class StreamSummary(FrozenModel):
    """What a client ends up with after reading the whole stream."""

    role: str | None = None
    content: str = ""
    reasoning: str = ""
    calls: tuple[StreamedCall, ...] = ()
    finish_reason: str | None = None
    errored: bool = False


class StreamCheck(FrozenModel):
    """The accumulated result and every violation found (empty when the stream keeps the contract)."""

    summary: StreamSummary
    violations: tuple[Violation, ...]


class _Call:
    __slots__ = ("call_id", "fragments", "name")

    def __init__(self, call_id: str, name: str) -> None:
        self.call_id = call_id
        self.name = name
        self.fragments: list[str] = []

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)


class _StreamWalker:
    """Reads payloads one at a time; every decision needs only what came before."""

    def __init__(self, include_usage: bool) -> None:
        self._include_usage = include_usage
        self._violations: list[Violation] = []
        self._identity: tuple[object, object, object] | None = None
        self._choice_chunks = 0
        self._role: str | None = None
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._answer_started = False
        self._calls: list[_Call] = []
        self._ids: set[str] = set()
        self._finish_reasons: list[str] = []
        self._usage_chunks = 0
        self._errors = 0
        self._done = False
        self._last_kind = ""

    def violate(self, rule: str, message: str) -> None:
        self._violations.append(Violation(rule=rule, message=message))

    def read(self, position: int, payload: str) -> None:
        if self._done:
            self.violate("done", f"payload {position} comes after [DONE]")
            return
        if payload == DONE_PAYLOAD:
            self._done = True
            return
        if self._errors:
            self.violate("11-error", f"payload {position} follows the error event (only [DONE] may)")
        try:
            decoded: object = json.loads(payload)
        except json.JSONDecodeError:
            self.violate("payload-json", f"payload {position} is not JSON: {payload[:80]!r}")
            return
        chunk = as_object(decoded)
        if chunk is None:
            self.violate("payload-json", f"payload {position} is not a JSON object")
        elif "error" in chunk:
            self._read_error(position, chunk)
        else:
            self._read_chunk(position, chunk)

    def _read_error(self, position: int, chunk: JsonMapping) -> None:
        self._errors += 1
        self._last_kind = "error"
        if self._errors > 1:
            self.violate("11-error", f"payload {position} is a second error event")
        body = as_object(chunk["error"])
        if body is None or not isinstance(body.get("message"), str) or not isinstance(body.get("type"), str):
            self.violate("11-error", f"error event {position} lacks error.message or error.type strings")
        elif "code" not in body or not isinstance(body["code"], str | None):
            self.violate("11-error", f"error event {position} lacks error.code (a string or null)")

    def _read_chunk(self, position: int, chunk: JsonMapping) -> None:
        if chunk.get("object") != "chat.completion.chunk":
            self.violate("1-identity", f"chunk {position} has object {chunk.get('object')!r}")
        identity = (chunk.get("id"), chunk.get("created"), chunk.get("model"))
        if not (isinstance(identity[0], str) and as_int(identity[1]) is not None and isinstance(identity[2], str)):
            self.violate("1-identity", f"chunk {position} lacks a string id, integer created or string model")
        if self._identity is None:
            self._identity = identity
        elif identity != self._identity:
            self.violate("1-identity", f"chunk {position} has id/created/model {identity}, first had {self._identity}")
        if self._last_kind == "usage":
            self.violate("9-usage", f"chunk {position} follows the usage chunk (it must be last before [DONE])")
        choices = as_list(chunk.get("choices"))
        usage = chunk.get("usage")
        if usage is not None:
            self._read_usage(position, usage, choices)
        elif choices is None or len(choices) != 1:
            self.violate("choice-shape", f"chunk {position} must carry exactly one choice")
        else:
            self._read_choice(position, choices[0])

    def _read_usage(self, position: int, usage: object, choices: Sequence[object] | None) -> None:
        self._usage_chunks += 1
        self._last_kind = "usage"
        if not self._include_usage:
            self.violate("9-usage", f"chunk {position} carries usage although include_usage was not asked")
        if self._usage_chunks > 1:
            self.violate("9-usage", f"chunk {position} is a second usage chunk")
        if choices is None or len(choices) != 0:
            self.violate("9-usage", f"usage chunk {position} must have `choices: []`")
        fields = as_object(usage) or {}
        prompt, completion, total = (as_int(fields.get(name)) for name in _USAGE_COUNTS)
        if prompt is None or completion is None or total is None:
            self.violate("9-usage", f"usage chunk {position} lacks integer {', '.join(_USAGE_COUNTS)}")
            return
        if total != prompt + completion:
            self.violate("9-usage", f"usage chunk {position}: total_tokens {total} != {prompt} + {completion}")
        prompt_details = as_object(fields.get("prompt_tokens_details"))
        completion_details = as_object(fields.get("completion_tokens_details"))
        if prompt_details is None or as_int(prompt_details.get("cached_tokens")) is None:
            self.violate("9-usage", f"usage chunk {position} lacks prompt_tokens_details.cached_tokens")
        if completion_details is None or as_int(completion_details.get("reasoning_tokens")) is None:
            self.violate("9-usage", f"usage chunk {position} lacks completion_tokens_details.reasoning_tokens")

    def _read_choice(self, position: int, raw_choice: object) -> None:
        self._choice_chunks += 1
        first = self._choice_chunks == 1
        self._last_kind = "choice"
        choice = as_object(raw_choice)
        delta = as_object(choice.get("delta")) if choice is not None else None
        if choice is None or delta is None or choice.get("index") != 0:
            self.violate("choice-shape", f"chunk {position}: the choice needs index 0 and a delta object")
            return
        if self._finish_reasons:
            self.violate("8-finish", f"chunk {position} follows the finish chunk (it must be the last choice chunk)")
        self._read_role(position, delta, first)
        self._read_text(position, delta)
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            entries = as_list(tool_calls)
            if entries is None:
                self.violate("4-tool-call-first-delta", f"chunk {position}: delta.tool_calls is not a list")
            else:
                for entry in entries:
                    self._read_tool_call(position, entry)
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None:
            self._finish_reasons.append(str(finish_reason))
            if finish_reason not in _FINISH_REASONS:
                self.violate("8-finish", f"chunk {position}: unknown finish_reason {finish_reason!r}")
            if len(delta) != 0:
                self.violate("8-finish", f"chunk {position}: the finish chunk's delta must be {{}}, got {dict(delta)}")

    def _read_role(self, position: int, delta: JsonMapping, first: bool) -> None:
        role = delta.get("role")
        if role is None:
            if first:
                self.violate("2-role-once", f"chunk {position}: the first chunk must carry delta.role")
            return
        if not first:
            self.violate("2-role-once", f"chunk {position} repeats delta.role (clients concatenate it)")
            return
        if role != "assistant":
            self.violate("2-role-once", f"chunk {position}: role is {role!r}, not 'assistant'")
        self._role = str(role)

    def _read_text(self, position: int, delta: JsonMapping) -> None:
        reasoning = delta.get("reasoning_content")
        content = delta.get("content")
        if reasoning is not None:
            if not isinstance(reasoning, str):
                self.violate("10-reasoning", f"chunk {position}: reasoning_content is not a string")
            elif reasoning:
                if self._answer_started:
                    self.violate("10-reasoning", f"chunk {position}: reasoning after content or a tool call began")
                self._reasoning.append(reasoning)
        if content is not None:
            if not isinstance(content, str):
                self.violate("3-content", f"chunk {position}: content is not a string")
            elif content:
                self._answer_started = True
                self._content.append(content)

    def _read_tool_call(self, position: int, raw_entry: object) -> None:
        self._answer_started = True
        entry = as_object(raw_entry)
        index = as_int(entry.get("index")) if entry is not None else None
        if entry is None or index is None:
            self.violate("5-tool-call-later-delta", f"chunk {position}: a tool_calls entry without an integer index")
            return
        if index < len(self._calls):
            self._read_later_delta(position, index, entry)
        else:
            self._read_first_delta(position, index, entry)

    def _read_first_delta(self, position: int, index: int, entry: JsonMapping) -> None:
        where = f"chunk {position}, call {index}"
        if index != len(self._calls):
            self.violate("7-indices", f"{where}: index skips ahead (expected {len(self._calls)}: dense from 0)")
        call_id = entry.get("id")
        function = as_object(entry.get("function"))
        name = function.get("name") if function is not None else None
        if not isinstance(call_id, str) or TOOL_CALL_ID_PATTERN.match(call_id) is None:
            self.violate("4-tool-call-first-delta", f"{where}: id {call_id!r} is not call_ + 24 alphanumerics")
        elif call_id in self._ids:
            self.violate("7-indices", f"{where}: id {call_id} was already used by another call")
        if entry.get("type") != "function":
            self.violate("4-tool-call-first-delta", f"{where}: type must be 'function'")
        if not isinstance(name, str) or not name:
            self.violate("4-tool-call-first-delta", f"{where}: function.name must be a non-empty string")
        if function is None or function.get("arguments") != "":
            self.violate("4-tool-call-first-delta", f"{where}: function.arguments must be '' in the first delta")
        if set(entry) - _FIRST_CALL_KEYS or (function is not None and set(function) - {"name", "arguments"}):
            self.violate("4-tool-call-first-delta", f"{where}: unexpected keys {sorted(entry)}")
        self._ids.add(str(call_id))
        # Dense indices are checked above; the call is stored at the next slot so later deltas still resolve.
        call = _Call(str(call_id), str(name))
        arguments = function.get("arguments") if function is not None else None
        if isinstance(arguments, str):
            call.fragments.append(arguments)
        self._calls.append(call)

    def _read_later_delta(self, position: int, index: int, entry: JsonMapping) -> None:
        where = f"chunk {position}, call {index}"
        call = self._calls[index]
        function = as_object(entry.get("function"))
        if function is None:
            self.violate("5-tool-call-later-delta", f"{where}: an entry without a function object")
            return
        if set(entry) != {"index", "function"} or set(function) != {"arguments"}:
            keys = sorted({*entry, *(f"function.{key}" for key in function)})
            self.violate("5-tool-call-later-delta", f"{where}: only index and function.arguments allowed, got {keys}")
        fragment = function.get("arguments")
        if not isinstance(fragment, str):
            self.violate("5-tool-call-later-delta", f"{where}: function.arguments is not a string")
            return
        if fragment and call.arguments and parses_as_json(call.arguments):
            self.violate("6-parsable-prefix", f"{where}: a fragment after {call.arguments[:60]!r} already parsed")
        call.fragments.append(fragment)

    def finish(self) -> StreamCheck:
        if not self._done:
            self.violate("done", "the stream does not end with data: [DONE]")
        if not self._errors:
            self._check_ending()
        summary = StreamSummary(
            role=self._role,
            content="".join(self._content),
            reasoning="".join(self._reasoning),
            calls=tuple(
                StreamedCall(index=index, call_id=call.call_id, name=call.name, arguments=call.arguments)
                for index, call in enumerate(self._calls)
            ),
            finish_reason=self._finish_reasons[0] if self._finish_reasons else None,
            errored=self._errors > 0,
        )
        return StreamCheck(summary=summary, violations=tuple(self._violations))

    def _check_ending(self) -> None:
        if len(self._finish_reasons) != 1:
            self.violate("8-finish", f"{len(self._finish_reasons)} finish chunks (exactly one is required)")
        reason = self._finish_reasons[0] if self._finish_reasons else None
        # After calls "tool_calls" (what agent loops run calls on), a named tool_choice too: the finish reason
        # matches the message. "length" is the failure rule's report of a call cut off by max_tokens.
        if self._calls and reason not in ("tool_calls", "length"):
            self.violate("8-finish", f"{len(self._calls)} tool call(s) but finish_reason {reason!r}")
        if not self._calls and reason == "tool_calls":
            self.violate("8-finish", "finish_reason 'tool_calls' without any tool call")
        if self._include_usage and self._usage_chunks == 0:
            self.violate("9-usage", "include_usage was asked but no usage chunk came")
        for index, call in enumerate(self._calls):
            cut_off = reason == "length" and index == len(self._calls) - 1
            if not cut_off and not parses_as_json_object(call.arguments):
                shown = call.arguments[:80]
                self.violate("3-arguments-json", f"call {index}: arguments {shown!r} are not a JSON object")


def walk_stream(payloads: Sequence[str], *, include_usage: bool) -> StreamCheck:
    """Check one streamed response's `data:` payloads (in order, `[DONE]` included) against the contract."""
    walker = _StreamWalker(include_usage)
    for position, payload in enumerate(payloads):
        walker.read(position, payload)
    return walker.finish()
