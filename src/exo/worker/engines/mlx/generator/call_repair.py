"""Repair of a failed call in one chat completion: hold an at-risk call's chunks back until it is settled, and when
it fails, say where the reply goes back to and with which processors it is re-decoded (constrained/repair.py says
which calls and which grammar).

A call is *at risk* where no grammar fully holds it (see `tools_at_risk`). While such a call is written, its chunks
are held here instead of being sent, so a failed call can still be taken back: the client receives the repaired
call, or, where the repair is not possible or fails again, the call exactly as the failure rule makes it. A call
to a tool the grammar does hold is released as soon as its name is read.
"""

from collections.abc import Callable
from dataclasses import dataclass

from exo.shared.types.chunks import ParsedChunk
from exo.tool_calls import ToolStreamParser
from exo.tool_calls.loop_guard import CallKey
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.stop_sequences import StopSequenceMatcher

RepairProcessors = Callable[[list[int], CallKey | None], RequestProcessors | None]
"""Given the reply's tokens before the failed call and the failed call (None when it was rejected before its name
was read), the processors to re-decode under, or None where a repair cannot do better."""


@dataclass(frozen=True)
class ReplyState:
    """What a request's reply was just before the token that opened a call: where a repair goes back to."""

    parser: ToolStreamParser
    stops: StopSequenceMatcher
    generated: int
    reasoning_tokens: int


class CallRepair:
    """The repair bookkeeping of one request."""

    def __init__(self, at_risk: frozenset[str], processors: RepairProcessors) -> None:
        self._at_risk = at_risk
        self._processors = processors
        self._before_call: ReplyState | None = None
        self._held: list[ParsedChunk] = []
        self._holding = False
        self._trusted = False
        self._repaired_at: set[int] = set()
        """The reply positions (tokens generated) whose call was already re-decoded once."""

    def remember(self, state: Callable[[], ReplyState], parser: ToolStreamParser) -> None:
        """Before a token is taken: keep the reply's state while no call is open (a call may open with it)."""
        if not self._holding and not parser.in_call:
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

    def rewind(self, generated: list[int], failed: CallKey | None) -> tuple[ReplyState, RequestProcessors] | None:
        """For a held call that just failed: the state to go back to and the processors to re-decode under, or None
        where the call stays as the failure rule makes it (not held, already repaired once, or no better grammar)."""
        state = self._before_call
        if not self._holding or state is None or state.generated in self._repaired_at:
            return None
        processors = self._processors(generated[: state.generated], failed)
        if processors is None:
            return None
        self._repaired_at.add(state.generated)
        self._held = []
        self._holding = False
        return state, processors

    def grammar_now_holds_every_call(self, at_risk: frozenset[str]) -> None:
        """After a repair the lazy grammar runs for the rest of the reply: only its own gaps stay at risk."""
        self._at_risk = at_risk
