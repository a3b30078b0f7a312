"""The agent-loop guard: a call the model repeats although nothing it could learn from it has changed.

The server sees the whole conversation on every request, so it can tell when a model is caught in a loop (small
models re-issue one write dozens of times) from when it repeats a call for a reason. `CallHistory` reads the
conversation since the user last spoke and says, for a call the reply makes, how many identical calls in a row came
before it and whether it is a *real loop*: either

- the third identical call in a row, after two results that were the same and neither an error; or
- the fifth identical call in a row, after four results that were the same error (a retry that has failed the same
  way four times: greedy decoding given the same error again writes the same call again, for ever).

Everything else goes through under every policy:

- a second identical call (polling a status twice; retrying once);
- a repeat after other calls in between (poll, sleep, poll; run the tests, edit, run them again);
- a repeat whose last result differed from the one before (a poll that progresses; an error that changed);
- a retry after an error result (`error_result`), until the call has failed the same way four times in a row (its
  first three retries);
- a repeat the user asked for (any user message after the calls, except one holding only Claude Code's
  `<system-reminder>` blocks, which it sends beside tool results).

`warn` reports a call from the second identical one in a row; `block` and `answer` withdraw a real loop (the
generator holds the call while it is written and takes it back). The schema that forbids a call's exact arguments,
which the repair of a failed call re-decodes under, is written by grammar/exclusion.py.
"""

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, cast

from exo.shared.types.chunks import ParsedChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.common import FrozenModel
from exo.shared.types.tasks import PromptMessage


class CallKey(FrozenModel):
    """A call as the guard compares it: its name and its arguments as canonical JSON (keys sorted)."""

    name: str
    arguments: str

    @classmethod
    def of(cls, name: str, arguments: Mapping[str, object] | str) -> "CallKey":
        return cls(name=name, arguments=canonical_arguments(arguments))

    def describe(self) -> str:
        return f"{self.name}({self.arguments})"


def canonical_arguments(arguments: Mapping[str, object] | str) -> str:
    """Arguments as sorted compact JSON; text that is not a JSON object is kept as written."""
    value: object = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):  # not JSON, or nested past what the parser recurses
            return arguments
    if not isinstance(value, dict):
        return arguments if isinstance(arguments, str) else json.dumps(value, sort_keys=True)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class TurnCall(FrozenModel):
    """A call of one assistant turn and what it got back."""

    key: CallKey
    result: str | None = None
    """The text of its result (the `tool` messages with its id, joined); None when the history has none."""
    error: bool = False
    """Whether that result reads as an error (`error_result`)."""


SAME_RESULTS: Final = 2
"""A repeat after this many identical results in a row, none an error, is a real loop (the third call)."""
SAME_ERRORS: Final = 4
"""A repeat after this many identical error results in a row is a real loop (the fifth call: the call and three
retries all failed the same way). Fewer go through: a retry after an error is legitimate, and common retry policies
give up after three."""


class Loop(FrozenModel):
    """Why a call made now would be a real loop (`CallHistory.loop`)."""

    call: int
    """Which identical call in a row it would be (3 and on, or 5 and on after errors)."""
    same_results: int
    """How many identical results in a row came before it."""
    errors: bool
    """Whether those results are errors."""

    def reason(self) -> str:
        """The words of the notice that a call was withdrawn."""
        if self.errors:
            return f"identical call {self.call} in a row after the same error result {self.same_results} times"
        return "the third identical call in a row after two identical results"

    def after(self) -> str:
        """What `warn`'s sentence about the repeat adds."""
        return f"after the same error result {self.same_results} times" if self.errors else "after identical results"


def _same_results(made: Sequence[TurnCall]) -> int:
    """How many of the last calls of `made` got the same result (whitespace around it aside), all errors or none
    (0 when the last has no result)."""
    if not made or made[-1].result is None:
        return 0
    last = made[-1]
    count = 0
    for call in reversed(made):
        if call.result is None or call.error != last.error or call.result.strip() != (last.result or "").strip():
            break
        count += 1
    return count


class CallHistory(FrozenModel):
    """What the guard reads from a conversation: the call turns since the user last spoke."""

    turns: tuple[tuple[TurnCall, ...], ...] = ()
    """The calls of each assistant turn since the user last spoke, oldest first (an assistant turn without calls
    is an empty turn: it breaks a row)."""

    @classmethod
    def of(cls, messages: Iterable[PromptMessage]) -> "CallHistory":
        listed = list(messages)
        results: dict[str, list[str]] = {}
        for message in listed:
            if message.role == "tool" and message.tool_call_id:
                results.setdefault(message.tool_call_id, []).append(message.content)
        turns: list[tuple[TurnCall, ...]] = []
        for message in listed:
            if message.role == "user" and _user_spoke(message.content):
                turns = []
            if message.role != "assistant":
                continue
            turn: list[TurnCall] = []
            for call in message.tool_calls:
                texts = results.get(call.call_id)
                result = "".join(texts) if texts is not None else None
                error = result is not None and error_result(result)
                turn.append(TurnCall(key=CallKey.of(call.name, call.arguments), result=result, error=error))
            turns.append(tuple(turn))
        return cls(turns=tuple(turns))

    def in_a_row(self, call: CallKey) -> int:
        """How many of the latest turns, in a row, made `call` (0: the latest turn did not)."""
        count = 0
        for turn in reversed(self.turns):
            if not any(made.key == call for made in turn):
                break
            count += 1
        return count

    def real_loop(self, call: CallKey) -> bool:
        """Whether `call` made now would be a real loop (`loop` says why)."""
        return self.loop(call) is not None

    def loop(self, call: CallKey) -> Loop | None:
        """Why `call` made now would be a real loop; None when it would not be one.

        A real loop is the third identical call in a row or later, after two results that are the same (whitespace
        around them aside) and neither an error (`SAME_RESULTS`), or the fifth or later, after four that are the
        same error (`SAME_ERRORS`)."""
        row = self.in_a_row(call)
        made = [next(made for made in turn if made.key == call) for turn in self.turns[len(self.turns) - row :]]
        same = _same_results(made)
        errors = bool(made) and made[-1].error
        if same < (SAME_ERRORS if errors else SAME_RESULTS):
            return None
        return Loop(call=row + 1, same_results=same, errors=errors)

    def looping_calls(self) -> tuple[CallKey, ...]:
        """The calls that would be a real loop if the reply made them again (those of the latest turn)."""
        looping: list[CallKey] = []
        for made in self.turns[-1] if self.turns else ():
            if made.key not in looping and self.real_loop(made.key):
                looping.append(made.key)
        return tuple(sorted(looping, key=lambda key: (key.name, key.arguments)))

    def findings(self, calls: Sequence[CallKey]) -> tuple[str, ...]:
        """What `warn` reports about a reply that made `calls`: each call from the second identical one in a row."""
        found: list[str] = []
        for call in calls:
            before = self.in_a_row(call)
            if before:
                loop = self.loop(call)
                after = f", {loop.after()}" if loop is not None else ""
                found.append(
                    f"repeated call {call.describe()}: identical call {before + 1} in a row since the user last "
                    f"spoke{after}"
                )
        return tuple(found)

    def repeated(self, calls: Sequence[CallKey]) -> int:
        """How many of `calls` repeat a call of the latest turn (what `warn` reports and /metrics counts)."""
        return sum(self.in_a_row(call) > 0 for call in calls)


_REMINDERS_ONLY: Final = re.compile(r"\s*(?:<system-reminder>.*?</system-reminder>\s*)+", re.DOTALL)
_ERROR_OPENING: Final = re.compile(
    r"^[\s*_#>\[(!-]*(?:error|exception|traceback|fatal|failed|failure)\b", re.IGNORECASE
)
# Tools that report a failure in plain words (opencode sends a failed tool's message as the result, with no flag and no
# "Error" in front: "File not found: …", "Offset 10 is out of range for this file (2 lines)", its web fetch's
# "Transport error (GET …)", its skill tool's "ripgrep execution failed"). What failed is named before "error" or
# "failed", so a count such as "0 failed" or a file such as error.py is no failure.
_FAILURE_PHRASE: Final = re.compile(
    r"\b(?:not found|out of range|no such file|does not exist|doesn't exist|permission denied|not permitted|"
    r"cannot|can't|could not|couldn't|unable to|timed out|connection refused|invalid|"
    r"(?:transport|network|connection|request|http|execution|runtime|internal|server|fetch|command) "
    r"(?:error|failed|failure))\b",
    re.IGNORECASE,
)
_EXIT_CODE_OPENING: Final = re.compile(r"^\s*(?:exit code|process exited with code)\W*(-?\d+)", re.IGNORECASE)
_ERROR_FLAGS: Final = (("is_error", True), ("success", False), ("ok", False))
_EXIT_CODE_KEYS: Final = ("exit_code", "exitCode", "returncode")


def _user_spoke(content: str) -> bool:
    """Whether a user message is the user speaking: some text, and not only `<system-reminder>` blocks."""
    return bool(content.strip()) and _REMINDERS_ONLY.fullmatch(content) is None


def error_result(text: str) -> bool:
    """Whether a tool result reads as an error. The dialects have no common flag (only Messages has `is_error`,
    which its adapter writes into the result as "Error: …"), so the text is read:

    - it opens with error, exception, traceback, fatal, failed or failure (any case, after markup such as `**`,
      `#` or `[`);
    - its first line says a failure in words: not found, out of range, no such file, does not exist, permission
      denied, not permitted, cannot, could not, unable to, timed out, connection refused, invalid, or a transport,
      network, connection, request, HTTP, execution, runtime, internal, server, fetch or command error (or
      failed, failure);
    - it opens with a non-zero "Exit code: N" or "Process exited with code N" (Codex's shell output);
    - it is a JSON object with a truthy `error`, `"is_error": true`, `"success": false`, `"ok": false`, or a non-zero
      `exit_code` / `exitCode` / `returncode` at its top level or in its `metadata`.

    Reading too much as an error only makes the guard withdraw less."""
    if _ERROR_OPENING.match(text) or _FAILURE_PHRASE.search(text.lstrip().partition("\n")[0]):
        return True
    exit_code = _EXIT_CODE_OPENING.match(text)
    if exit_code is not None:
        return int(exit_code.group(1)) != 0
    try:
        value: object = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and _error_object(cast(dict[str, object], value))


def _error_object(value: Mapping[str, object]) -> bool:
    if value.get("error") or any(key in value and value[key] is flag for key, flag in _ERROR_FLAGS):
        return True
    metadata = value.get("metadata")
    places = [value, cast(dict[str, object], metadata)] if isinstance(metadata, dict) else [value]
    codes = [place.get(key) for place in places for key in _EXIT_CODE_KEYS]
    return any(isinstance(code, int) and not isinstance(code, bool) and code != 0 for code in codes)


class ReplyCalls:
    """The calls of a reply, assembled from its parsed chunks as they go by."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._arguments: dict[int, list[str]] = {}

    def add(self, chunks: Iterable[ParsedChunk]) -> None:
        for chunk in chunks:
            if isinstance(chunk, ToolCallChunk):
                self._names[chunk.index] = chunk.name
                self._arguments[chunk.index] = []
            elif isinstance(chunk, ToolCallArgumentsChunk) and chunk.index in self._arguments:
                self._arguments[chunk.index].append(chunk.fragment)

    def keys(self) -> list[CallKey]:
        return [CallKey.of(self._names[index], "".join(self._arguments[index])) for index in sorted(self._names)]


def withdrawal_finding(call: CallKey, reason: str, then: str) -> str:
    """What `block` and `answer` report about a call they took back (`reason`: `Loop.reason`; `then`: what the reply
    did instead)."""
    return f"repeated call {call.describe()} withdrawn: {reason}, so {then}"


def withdrawn_reply_notice(withdrawals: Sequence[str]) -> str:
    """The text of a reply that was nothing but withdrawn calls, so the user reads why it is otherwise empty
    (`withdrawals`: the `withdrawal_finding`s)."""
    return f"[exo loop guard: {withdrawals[-1]}; the model wrote no other answer]"


def kept_loop_finding(call: CallKey, why: str) -> str:
    """What `block` and `answer` report about a real loop they could not take back (`why`)."""
    return f"repeated call {call.describe()} not withdrawn although it loops: {why}"
