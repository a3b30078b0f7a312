"""Calls of one chat completion that may still be taken back: their chunks are held until the call is settled, and
when it is taken back this says where the reply goes back to.

Two reasons take a call back (the request decides which processors decode on): a call that failed to parse or
validate is re-decoded under a grammar (a repair: tool_calls/grammar/policy.py says which calls and which grammar),
and a call the loop guard withdraws (a real loop, see `CallHistory.looping_calls`) is replaced by a reply without it.

A call is *at risk* when its tool is one of those (see `tools_at_risk` and `CallHistory.looping_calls`). While
such a call is written, its chunks are held here instead of being sent, so it can still be taken back: the client
receives the call only once it is settled, or never. A call to a tool that is not at risk is released as soon as
its name is read.
"""

from collections.abc import Callable
from dataclasses import dataclass

from exo.shared.types.chunks import ParsedChunk
from exo.tool_calls import ToolStreamParser
from exo.tool_calls.loop_guard import CallKey, ReplyCalls
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.stop_sequences import StopSequenceMatcher

RepairProcessors = Callable[[list[int], CallKey | None], RequestProcessors | None]
"""Given the reply's tokens before the failed call and the failed call (None when it was rejected before its name
was read), the processors to re-decode under, or None where a repair cannot do better."""


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
