"""Tokenise a prompt only as far as the model's context allows: a prompt far too long is refused after reading
about as much of it as fits, instead of after tokenising all of it.

Tokenising a 30 MB prompt in one call holds the runner (and every request queued behind it) for tens of seconds
and gigabytes of token offsets, all to learn that it has millions of tokens. Text up to `CHARACTERS_PER_TOKEN_CAP`
times the context is tokenised in one call as before (a prompt that fits almost always is that short). Longer text
is first counted piece by piece, each piece cut just before whitespace, where tokenisers split words anyway; the
count stops as soon as the pieces certainly hold more tokens than the context (allowing a few tokens of difference
at each cut). Text that fits after all is then tokenised in one call, exactly as a short prompt is.
"""

from collections.abc import Callable, Iterator
from typing import Final

# Prompts longer than this many characters per context token are counted piece by piece first. Code and prose
# average 3-5 characters a token; only highly repetitive text fits the context at more than 6.
CHARACTERS_PER_TOKEN_CAP: Final = 6
PIECE_CHARACTERS: Final = 16_384
# How far a piece's token count may fall short of its share of the whole text's count (a word cut at a piece's
# edge): generous, so the count stays a lower bound.
TOKENS_LOST_PER_CUT: Final = 8
# How far back from a piece's nominal end to look for whitespace to cut before.
_CUT_SEARCH: Final = 256

Encode = Callable[[str], list[int]]


class ContextLengthExceededError(ValueError):
    """The prompt leaves no room to generate within the model's context."""


def context_exceeded(prompt_tokens: int, context_length: int, *, at_least: bool = False) -> ContextLengthExceededError:
    """The error for a prompt of `prompt_tokens` tokens (`at_least` that many, when counting stopped early)."""
    size = f"more than {prompt_tokens}" if at_least else str(prompt_tokens)
    return ContextLengthExceededError(
        f"the prompt is {size} tokens but the model's context is {context_length} tokens; "
        "shorten the conversation or the tool definitions"
    )


def encode_within(encode: Encode, text: str, context_length: int) -> list[int]:
    """The tokens of `text`; ContextLengthExceededError, without tokenising much past the context, when it
    certainly has no room left to generate in `context_length` tokens."""
    if len(text) > context_length * CHARACTERS_PER_TOKEN_CAP:
        counted = 0
        for cuts, piece in enumerate(_pieces(text)):
            counted += len(encode(piece))
            at_least = counted - cuts * TOKENS_LOST_PER_CUT
            if at_least >= context_length:
                raise context_exceeded(at_least, context_length, at_least=True)
    return encode(text)


def _pieces(text: str) -> Iterator[str]:
    """`text` in pieces of about PIECE_CHARACTERS, each (but the last) ending just before a whitespace character."""
    start = 0
    while start < len(text):
        end = min(start + PIECE_CHARACTERS, len(text))
        if end < len(text):
            window = text[max(end - _CUT_SEARCH, start + 1) : end]
            space = max(window.rfind(" "), window.rfind("\n"))
            if space >= 0:
                end = end - len(window) + space
        yield text[start:end]
        start = end
