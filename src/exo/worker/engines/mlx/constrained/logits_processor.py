"""The mlx-lm logits processor that walks a tool-call grammar alongside generation.

mlx-lm calls each processor once per step with every token so far (the prompt it was given, then each sampled
token) and the next-token logits. The processor feeds the tokens sampled since its last call to the llguidance
matcher, asks it for the allowed-token bitmask and sets every other logit to -inf.
"""

import logging
from typing import Final

import mlx.core as mx
import numpy as np
from llguidance import LLMatcher
from mlx_lm.tokenizer_utils import TokenizerWrapper
from numpy.typing import NDArray

from exo.tool_calls.grammar.spec import JsonAnswerSpec, ToolConstraintSpec
from exo.tool_calls.request_grammar import grammar_for
from exo.worker.engines.mlx.constrained.compiled import guidance_tokenizer, new_matcher
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

logger = logging.getLogger(__name__)

_BITS_PER_WORD: Final = 32
_BIAS_BY_BIT: Final = np.array([-np.inf, 0.0], dtype=np.float32)


class ToolCallConstraintError(RuntimeError):
    """The sampled tokens left the grammar: only possible if something other than this processor chose them."""


class ToolCallLogitsProcessor:
    """Masks logits to the tokens a tool-call grammar allows. One per request: it holds that request's state."""

    def __init__(self, matcher: LLMatcher, vocabulary_size: int, *, prompt_length: int) -> None:
        self._matcher: Final = matcher
        self._vocabulary_size: Final = vocabulary_size
        self._prompt_length: int | None = None
        self._expected_prompt_length: Final = prompt_length
        self._in_history: list[bool] = []
        """Per token consumed after the prompt: whether the matcher recorded it. Once the grammar has ended,
        llguidance accepts the end-of-sequence token without recording it, so rolling back must not count such
        tokens."""
        words = (vocabulary_size + _BITS_PER_WORD - 1) // _BITS_PER_WORD
        self._bitmask: Final[NDArray[np.int32]] = np.zeros(words, dtype=np.int32)
        self._previous_bitmask: Final[NDArray[np.int32]] = np.zeros(words, dtype=np.int32)
        self._bias: mx.array | None = None
        self._resumed = 0

    def resume_after(self, generated: list[int]) -> bool:
        """Start part-way into a reply (a repair re-decodes from there): consume the reply's `generated` tokens now,
        so the first call, which shows them after the prompt, goes on from them. False where the grammar does not
        allow them (the processor is then unusable)."""
        if self._prompt_length is not None or self._in_history:
            raise ToolCallConstraintError("a processor resumes only before its first call")
        for token in generated:
            recorded = not self._matcher.is_stopped()
            if not self._matcher.consume_token(token):
                return False
            self._in_history.append(recorded)
        self._resumed = len(generated)
        return True

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        """Advance the grammar by the newly sampled tokens and mask `logits` (shape (1, V) or (V,))."""
        self._consume_new_tokens(tokens)
        return logits + self._logit_bias(logits.shape[-1], logits.dtype)

    def rollback(self, num_tokens: int) -> None:
        """Forget the last `num_tokens` consumed tokens: speculative decoding calls the processor for each drafted
        position, then takes back the drafts the model rejected."""
        if num_tokens <= 0:
            return
        recorded = sum(self._in_history[-num_tokens:])
        if num_tokens > len(self._in_history) or (recorded and not self._matcher.rollback(recorded)):
            raise ToolCallConstraintError(f"cannot roll the grammar back by {num_tokens} tokens")
        del self._in_history[-num_tokens:]

    def forced_tokens(self, tokens: mx.array) -> list[int]:
        """The tokens the grammar forces next, after `tokens` (its only continuation, in the tokenizer's canonical
        split): a fixed key, punctuation, a tool's name, a closing marker. Empty where the model has a choice."""
        self._consume_new_tokens(tokens)
        if self._matcher.is_stopped():
            return []
        return self._matcher.compute_ff_tokens()

    def allowed_draft_length(self, tokens: mx.array, draft: list[int]) -> int:
        """How many leading tokens of `draft`, proposed to follow `tokens`, the grammar allows (the rest is cut)."""
        self._consume_new_tokens(tokens)
        return self._matcher.validate_tokens(draft)

    def _consume_new_tokens(self, tokens: mx.array) -> None:
        if self._prompt_length is None:
            # The first call comes before anything is sampled, so whatever it shows is the prompt. Trusting it over
            # the caller's count keeps the grammar right when a prompt cache hands mlx-lm only the uncached suffix.
            self._prompt_length = tokens.shape[0] - self._resumed
            if self._prompt_length != self._expected_prompt_length:
                logger.debug(
                    "grammar anchored on the %d prompt tokens mlx-lm showed (the caller counted %d)",
                    self._prompt_length,
                    self._expected_prompt_length,
                )
        start = self._prompt_length + len(self._in_history)
        if tokens.shape[0] <= start:
            return
        with STEP_CLOCK.part("device"):  # the sampled token may still be being computed
            new_tokens: list[int] = tokens[start:].tolist()  # pyright: ignore[reportAssignmentType] -- 1-D int array
        for token in new_tokens:
            recorded = not self._matcher.is_stopped()
            if not self._matcher.consume_token(token):
                error = self._matcher.get_error()
                raise ToolCallConstraintError(f"token {token} violates the tool-call grammar: {error}")
            self._in_history.append(recorded)

    def _logit_bias(self, logits_size: int, dtype: mx.Dtype) -> mx.array:
        """0 for allowed tokens, -inf for the rest (ids past the tokenizer's vocabulary are padding: banned).

        An additive bias rather than `mx.where`: on the CPU backend the add is several times cheaper. Inside a
        string or free text the mask rarely changes, so the bias from the previous step is reused when it can be.
        """
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        bias = self._bias
        if bias is not None and bias.shape[-1] == logits_size and np.array_equal(self._bitmask, self._previous_bitmask):
            return bias if bias.dtype == dtype else bias.astype(dtype)
        usable = min(logits_size, self._vocabulary_size)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little", count=usable)
        values = np.full(logits_size, -np.inf, dtype=np.float32)
        np.take(_BIAS_BY_BIT, bits, out=values[:usable])
        self._bias = mx.array(values).astype(dtype)
        np.copyto(self._previous_bitmask, self._bitmask)
        return self._bias


def make_logits_processor(
    tokenizer: TokenizerWrapper, spec: ToolConstraintSpec | JsonAnswerSpec, *, prompt_length: int
) -> ToolCallLogitsProcessor:
    """A processor enforcing `spec` (tool calls, or a structured-output answer) for one request.

    `prompt_length` is the number of tokens handed to mlx-lm's generate (what it passes back to processors ahead of
    the sampled tokens); the processor anchors on what the first call actually shows, and logs a difference at debug
    level. Schema keywords llguidance cannot enforce are logged once per request. Tokenizer and compiled grammar come
    from caches, so a repeated schema compiles once; raises UnsupportedConstraintError when a schema cannot be
    enforced.
    """
    guidance = guidance_tokenizer(tokenizer)
    matcher = new_matcher(guidance.lltokenizer, grammar_for(spec, guidance.special_tokens))
    unenforced = matcher.get_grammar_warnings()
    if unenforced:
        logger.info("grammar: schema keywords not enforced (validated after decoding): %s", "; ".join(unenforced))
    return ToolCallLogitsProcessor(matcher, guidance.lltokenizer.vocab_size, prompt_length=prompt_length)
