"""How a node's runners decode: one frozen model, from the command line (each field is one `exo` flag or an engine
default) through the node and the runner's bootstrap to the engine, carried whole."""

from pydantic import field_validator

from exo.shared.types.common import FrozenModel
from exo.shared.types.tasks import LoopGuardPolicy, PromptLayout

PIECE_SECONDS = 0.5
"""The most one layer of a prefill piece should take. A step runs for half of it, then pauses at the next layer
boundary, so the runner reads its messages at least every 1.5x this: a cancel lands within about 0.75 s (the issue
asks for one second)."""


class LookupSettings(FrozenModel):
    """How prompt-lookup drafts are found and how long they may be."""

    max_draft_tokens: int = 8
    longest_ngram: int = 4
    shortest_ngram: int = 2
    """An n-gram this short or longer must match before anything is proposed (single tokens match far too often)."""
    adaptive: bool = True
    """Verify a draft only when the measured step costs say it pays (`draft_policy`); False verifies every draft."""


class DecodeSettings(FrozenModel):
    """How the runner decodes. The `exo` command sets the fields that have a flag (main.py's decode flags, whose
    destinations are these fields' names); the others keep the engine's defaults."""

    batch_size: int = 8
    """Most requests decoded together, joining and leaving between tokens (the runner allows 1 for a model whose
    cache cannot batch)."""
    speculation: LookupSettings | None = LookupSettings()
    """Prompt-lookup speculative decoding for a greedy request decoded alone (None: off; the flag's on/off is read
    as the default settings or None)."""
    auto_tool_grammar: bool = True
    """Under `tool_choice: "auto"`, hold a call the model opens to the tools' names and schemas (the lazy grammar);
    a request's `ToolPolicy.auto_grammar` overrides it."""
    tool_call_repair: bool = True
    """Under "auto", re-decode once under the lazy grammar a call that no grammar held and that failed to parse or
    validate (tool_calls/grammar/policy.py); a request's `ToolPolicy.repair` overrides it."""
    loop_guard: LoopGuardPolicy = "answer"
    """The agent-loop guard for requests that do not choose one (`ToolPolicy.loop_guard`)."""
    grammar_fast_forward: bool = True
    """Feed the tokens a grammar forces as a draft verified in one pass (greedy requests decoded alone, with
    speculation on); the output is the same token for token."""
    prompt_layout: PromptLayout = "tools-first"
    """Where the tool definitions go in the prompt (prompt_layout.py): before the system text where the template
    allows it exactly (so a client's tools stay a cached prefix across project folders), or the template's place."""
    overlap: bool = True
    """A request decoding alone launches its next step on the lazily sampled token of the step in flight, so the
    host's work on a token (parsing, sending) overlaps the next forward pass (generator/solo.py), and a batch step with
    a member under a grammar launches its forward pass before the members' masks (generator/batch_step.py); False
    launches the next step only after the token was accepted, and a batch's masks before its pass. The output is the
    same either way."""
    accept_beside: bool = True
    """With `overlap`, where a step is computed on the CPU (whose launch returns only once most of the pass is done):
    a step's tokens are accepted (detokenized, parsed, stop-checked) on a helper thread while the loop launches the next
    step, instead of after that launch (generator/beside.py). The output is the same either way; on an accelerator
    the loop's own accept already runs while the device computes, and this is not used."""
    matmul_plan: bool = True
    """Plan the few-row float32 products of decoding (`engines/mlx/cpu/matmul_plan.py`) where the weights are
    float32."""
    prefill_step_size: int = 512
    """Prompt tokens per forward pass while a pipeline prefills (its ranks prefill in lockstep)."""
    prefill_piece_seconds: float = PIECE_SECONDS
    """The most one layer of a prefill piece should take; a prefill step runs half of it (`prefill.py`), so a cancel
    or the other requests' next decode step waits about 1.5x this at most."""
    slow_prefill_seconds_per_token: float = 0.0
    """For tests only: the least each prompt token takes to prefill (`prefill.SLOW_PREFILL_VARIABLE`, read from the
    runner's environment; 0: no delay)."""

    @field_validator("speculation", mode="before")
    @classmethod
    def _speculation_switch(cls, value: object) -> object:
        """The command line's `--speculation`/`--no-speculation`: on is the default lookup settings."""
        if isinstance(value, bool):
            return LookupSettings() if value else None
        return value
