"""The take-back of one chat completion's calls: which calls may still be taken back, their chunks held until the
call is settled, and where the reply goes back to when one is.

Two reasons take a call back: a call that failed to parse or validate is re-decoded under a grammar (a repair:
tool_calls/grammar/policy.py says which calls and which grammar), and a call the loop guard withdraws (a real loop,
see `CallHistory.looping_calls`) is replaced by a reply without it (grammar_choice.py builds the processors of both).
`TakeBack` decides, token by token, and answers the request with the chunks to send or a `GoBack`; the request
applies it.

A call is *at risk* when its tool is one of those (see `tools_at_risk` and `CallHistory.looping_calls`). While
such a call is written, its chunks are held here instead of being sent, so it can still be taken back: the client
receives the call only once it is settled, or never. A call to a tool that is not at risk is released as soon as
its name is read.
"""

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass

from exo.shared.types.chunks import ParsedChunk
from exo.shared.types.common import FinishReason, TaskId
from exo.tool_calls import ToolStreamParser
from exo.tool_calls.loop_guard import CallKey, ReplyCalls, withdrawal_finding
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.request_context import LoopGuardCalls
from exo.worker.engines.mlx.generator.stop_sequences import StopSequenceMatcher

logger = logging.getLogger(__name__)

RepairProcessors = Callable[[list[int], CallKey | None], RequestProcessors | None]
"""Given the reply's tokens before the failed call and the failed call (None when it was rejected before its name
was read), the processors to re-decode under, or None where a repair cannot do better."""

AnswerProcessors = Callable[[list[int], frozenset[str]], RequestProcessors | None]
"""Given the reply's tokens before a withdrawn call and the tools to take away (empty: every tool), the processors
to decode on without them (None: the reply ends where the call began)."""


@dataclass(frozen=True)
class ReplyState:
    """What a request's reply was just before the token that opened a call: where a call is taken back to."""

    parser: ToolStreamParser
    stops: StopSequenceMatcher
    generated: int
    reasoning_tokens: int


class CallHold:
    """The held calls of one request."""

    def __init__(self, at_risk: frozenset[str]) -> None:
        self._at_risk = at_risk
        self._before_call: ReplyState | None = None
        self._held: list[ParsedChunk] = []
        self._holding = False
        self._trusted = False
        self._repaired_at: set[int] = set()
        """The reply positions (tokens generated) whose call was already re-decoded once."""

    def remember(self, state: Callable[[], ReplyState], parser: ToolStreamParser) -> None:
        """Before a token is taken: keep the reply's state while no call is open (a call may open with it), nor
        begun (the pieces of its opening marker are part of the call: going back to before them leaves text that
        any grammar accepts)."""
        if not self._holding and not parser.in_call and not parser.holding_marker_start:
            self._trusted = False
            self._before_call = state()

    def route(self, chunks: list[ParsedChunk], parser: ToolStreamParser) -> list[ParsedChunk]:
        """The chunks a token produced, minus those held back while an at-risk call is open."""
        if not self._holding and parser.in_call and not self._trusted:
            self._holding = True
        if not self._holding:
            return chunks
        self._held += chunks
        name = parser.open_call_name
        if not parser.in_call or (name is not None and name not in self._at_risk):
            self._trusted = parser.in_call
            return self.release()
        return []

    def first_call(self, chunks: list[ParsedChunk]) -> CallKey | None:
        """The first call of the held region as it stands with `chunks` added (None when nothing is held)."""
        if not self._holding:
            return None
        calls = ReplyCalls()
        calls.add([*self._held, *chunks])
        keys = calls.keys()
        return keys[0] if keys else None

    def give_up(self, chunks: list[ParsedChunk]) -> list[ParsedChunk]:
        """A call failed and stays as the failure rule makes it: everything held, then `chunks`; the rest of its
        region is not held again."""
        self._trusted = self._trusted or self._holding
        return [*self.release(), *chunks]

    def release(self) -> list[ParsedChunk]:
        """Everything held, in order; nothing is held any more."""
        held, self._held = self._held, []
        self._holding = False
        return held

    def repair(
        self, generated: list[int], failed: CallKey | None, processors: RepairProcessors
    ) -> tuple[ReplyState, RequestProcessors] | None:
        """For a held call that just failed: the state to go back to and the processors to re-decode under, or None
        where the call stays as the failure rule makes it (not held, already repaired once, or no better grammar)."""
        state = self._before_call
        if not self._holding or state is None or state.generated in self._repaired_at:
            return None
        decoding = processors(generated[: state.generated], failed)
        if decoding is None:
            return None
        self._repaired_at.add(state.generated)
        self.withdraw()
        return state, decoding

    def withdraw(self) -> ReplyState | None:
        """Drop the held call: the state before it (None when nothing is held)."""
        state = self._before_call if self._holding else None
        self._held = []
        self._holding = False
        return state

    def hold(self, at_risk: frozenset[str]) -> None:
        """From now on, the tools whose calls are held (after a repair the lazy grammar runs for the rest of the
        reply: only its own gaps, and the calls the loop guard may withdraw, stay at risk)."""
        self._at_risk = at_risk


@dataclass(frozen=True)
class GoBack:
    """A call was taken back: the reply goes back to `state` and decodes on under `processors` (None: it ends
    there)."""

    state: ReplyState
    processors: RequestProcessors | None


def _finished_here(parser: ToolStreamParser, stops: StopSequenceMatcher) -> tuple[ToolStreamParser, list[ParsedChunk]]:
    """What finishing the reply here would make of the open call: the parser after it, and the chunks it gives."""
    finished = parser.snapshot()
    tail = [*finished.feed(copy.deepcopy(stops).flush()), *finished.finish()]
    return finished, tail


class TakeBack:
    """The calls of one request that may be taken back, and what the reply does when one is."""

    def __init__(
        self,
        task_id: TaskId,
        at_risk: frozenset[str],
        *,
        guard: LoopGuardCalls,
        repair: RepairProcessors | None,
        at_risk_after_repair: frozenset[str],
        answer: AnswerProcessors | None,
    ) -> None:
        self._task_id = task_id
        self._hold = CallHold(at_risk)
        self._guard = guard
        self._repair = repair
        self._at_risk_after_repair = at_risk_after_repair
        self._answer = answer
        self.withdrawals: list[str] = []
        """What the loop guard reported about each call it took back from this reply."""

    def remember(self, state: Callable[[], ReplyState], parser: ToolStreamParser) -> None:
        """Before a token is taken (see `CallHold.remember`)."""
        self._hold.remember(state, parser)

    def release(self) -> list[ParsedChunk]:
        """Everything still held, in order (the reply ends)."""
        return self._hold.release()

    def settle(
        self,
        chunks: list[ParsedChunk],
        *,
        parser: ToolStreamParser,
        stops: StopSequenceMatcher,
        generated: list[int],
        finish_reason: FinishReason | None,
        failures_before: int,
        sent_calls: bool,
    ) -> list[ParsedChunk] | GoBack:
        """After a token: the chunks it gives to send, or where the reply goes back to when the call they belong to
        was taken back (`failures_before`: the parser's failures before the token; `sent_calls`: the reply already
        sent calls)."""
        ended_by_model = finish_reason == "stop" and not stops.stopped and not parser.should_stop
        # Taken once, where the model ended the turn inside a call: both the failure and the repeat read it.
        ending = _finished_here(parser, stops) if ended_by_model and parser.in_call else None
        cut = finish_reason == "length" or stops.stopped
        failed = _failed_call(parser, ending, failures_before)
        if failed is not None:
            rewind = None if cut else self._rewind(generated, failed[0])
            return rewind if rewind is not None else self._hold.give_up(chunks)
        repeat = None if cut else self._written_repeat(chunks, parser, ending)
        if repeat is not None:
            return self._withdraw(repeat, generated, sent_calls)
        return self._hold.route(chunks, parser)

    def _written_repeat(
        self,
        chunks: list[ParsedChunk],
        parser: ToolStreamParser,
        ending: tuple[ToolStreamParser, list[ParsedChunk]] | None,
    ) -> CallKey | None:
        """The call the loop guard withdraws, when the held call ends with this token as one of them."""
        if not self._guard.withdrawn or (parser.in_call and ending is None):
            return None
        tail = ending[1] if ending is not None else []
        call = self._hold.first_call([*chunks, *tail])
        return call if call in self._guard.withdrawn else None

    def _withdraw(self, call: CallKey, generated: list[int], sent_calls: bool) -> GoBack:
        """Take the looping call back: the reply goes on from where it began without calls (`answer`) or without
        the looping tools (`block`, once), or, where it already made other calls (or the text before the call does
        not fit that grammar), ends there."""
        state = self._hold.withdraw()
        assert state is not None
        guard = self._guard
        block = guard.policy == "block" and not self.withdrawals
        taken_away = frozenset(looping.name for looping in guard.withdrawn) if block else frozenset[str]()
        # One going back per reply: a call written again after it (past the grammar, after a near miss of the
        # marker such as `<toolcall>`) would be decoded again from the same place, so the reply ends before it.
        answer = self._answer if not sent_calls and not self.withdrawals else None
        processors = answer(generated[: state.generated], taken_away) if answer is not None else None
        if processors is None:
            then = "the reply ended there"
        elif taken_away:
            then = f"the reply was decoded again without {', '.join(sorted(taken_away))}"
        else:
            then = "the reply was decoded again without calls"
        self.withdrawals.append(withdrawal_finding(call, guard.reasons[call], then))
        logger.info("task %s: agent loop: repeated call %s withdrawn, %s", self._task_id, call.describe(), then)
        if processors is not None:
            # The grammar gone back under has no call to a looping tool; should one come back anyway (after a near
            # miss of the marker, which the grammar lets through as text), it is held and withdrawn again.
            self._hold.hold(frozenset(looping.name for looping in guard.withdrawn))
        return GoBack(state, processors)

    def _rewind(self, generated: list[int], failed: CallKey | None) -> GoBack | None:
        """Go back to where the failed call started, to re-decode it under the repair grammar (None where the call
        stays as the failure rule makes it)."""
        if self._repair is None:
            return None
        rewind = self._hold.repair(generated, failed, self._repair)
        if rewind is None:
            return None
        state, processors = rewind
        logger.info("task %s: a failed tool call is re-decoded under the grammar", self._task_id)
        self._hold.hold(self._at_risk_after_repair)
        return GoBack(state, processors)


def _failed_call(
    parser: ToolStreamParser, ending: tuple[ToolStreamParser, list[ParsedChunk]] | None, failures_before: int
) -> tuple[CallKey | None] | None:
    """After a token: `(the failed call,)` when a call failed with it (None inside: failed before its name was
    read), including a call the end of the turn leaves broken (`ending`); None when no call failed."""
    if parser.call_failures == failures_before and ending is not None:
        parser = ending[0]
    if parser.call_failures == failures_before:
        return None
    failed = parser.failed_call
    return (CallKey.of(*failed) if failed else None,)
