"""llguidance tokenizers and compiled grammars, cached so an agent's repeated turns compile nothing new.

Building an LLTokenizer walks the whole vocabulary and compiling a grammar builds its lexer, so both are cached:
tokenizers per mlx-lm tokenizer object (a loaded model keeps one), compiled grammars per (tokenizer, grammar
text) in a small LRU. A cached matcher is a pristine template that is never advanced; each request gets a
`deep_copy` of it, which is cheap and leaves the template safe to share between threads.

The tokenizer (about 1.5 s for a 152k vocabulary on a CPU) belongs to loading the model, not to its first
constrained request: the runner calls `prepare_guidance` while it loads.
"""

import logging
import time
from collections.abc import Iterable
from functools import lru_cache
from typing import Final

import llguidance.hf
from llguidance import LLMatcher, LLTokenizer
from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import Tokenizer

from exo.tool_calls.grammar.spec import UnsupportedConstraintError

logger = logging.getLogger(__name__)

_TOKENIZER_CACHE_SIZE: Final = 4
_GRAMMAR_CACHE_SIZE: Final = 32


class GuidanceTokenizer:
    """An llguidance view of one mlx-lm tokenizer.

    llguidance's own reading of a Hugging Face tokenizer (`llguidance.hf.from_tokenizer`) builds a second Rust
    tokenizer from its JSON and keeps it: 57 MiB of the default model's runner. That reading only supplies each
    token's bytes and the special tokens here; the kept LLTokenizer is built from them, and tokenizes text (a forced
    string of a grammar, at most a few times a request) through the model's own tokenizer (`_SharedTokenizer`).
    """

    def __init__(self, tokenizer: TokenizerWrapper) -> None:
        hf_tokenizer = tokenizer._tokenizer  # pyright: ignore[reportPrivateUsage] -- mlx-lm exposes no accessor
        eos_ids: list[int] = sorted(tokenizer.eos_token_ids)
        try:
            # Without the slicer's token sets (`slices=[]`): this reading is dropped once its tokens are copied.
            reading = llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=eos_ids, slices=[])
        except ValueError as error:  # llguidance reads only fast (Rust `tokenizers`) tokenizers
            raise UnsupportedConstraintError(f"tokenizer cannot be used for constrained decoding: {error}") from error
        shared = _SharedTokenizer(reading, hf_tokenizer.backend_tokenizer, eos_ids[0])
        del reading
        self.lltokenizer: Final[LLTokenizer] = LLTokenizer(llguidance.TokenizerWrapper(shared), eos_token=eos_ids)

    def special_tokens(self, texts: Iterable[str]) -> dict[str, int]:
        """The texts that are one added token, with their ids.

        llguidance treats every added token as special (even ones the tokenizer marks `special: false`, as Qwen
        does for `<tool_call>`): a grammar can match it only by id, never by its text.
        """
        found: dict[str, int] = {}
        for text in texts:
            ids = self.lltokenizer.tokenize_str(text, parse_special=True)
            if len(ids) == 1 and self.lltokenizer.is_special_token(ids[0]):
                found[text] = ids[0]
        return found


class _SharedTokenizer:
    """What llguidance's TokenizerWrapper reads of a tokenizer: each token's bytes and the special tokens as
    llguidance read them (`reading`), and text tokenized by the model's own Rust tokenizer (`backend`)."""

    def __init__(self, reading: LLTokenizer, backend: Tokenizer, eos_token_id: int) -> None:
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        ids = range(reading.vocab_size)
        self.tokens = [reading.decode_bytes([token]) for token in ids]
        self.special_token_ids = [token for token in ids if reading.is_special_token(token)]
        self._backend = backend

    def __call__(self, text: str) -> list[int]:
        # A str only: the wrapper then passes text as str (it tries bytes first, which `encode` refuses).
        return self._backend.encode(text, add_special_tokens=False).ids


@lru_cache(maxsize=_TOKENIZER_CACHE_SIZE)
def guidance_tokenizer(tokenizer: TokenizerWrapper) -> GuidanceTokenizer:
    """The cached llguidance tokenizer for an mlx-lm tokenizer (keyed by the object's identity)."""
    return GuidanceTokenizer(tokenizer)


@lru_cache(maxsize=_GRAMMAR_CACHE_SIZE)
def compiled_template(lltokenizer: LLTokenizer, grammar: str) -> LLMatcher:
    template = LLMatcher(lltokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0)
    if template.is_error():
        # Raising keeps the failure out of the cache, so a fixed grammar is not shadowed by an old error.
        raise UnsupportedConstraintError(f"llguidance cannot compile the tool-call grammar: {template.get_error()}")
    return template


def new_matcher(lltokenizer: LLTokenizer, grammar: str) -> LLMatcher:
    """A fresh matcher for one request, copied from the cached compiled grammar."""
    return compiled_template(lltokenizer, grammar).deep_copy()


_WARM_GRAMMAR: Final = '%llguidance {}\nstart: "{" /[a-z]+/ "}"'
"""A grammar with a literal and a regex lexeme: compiling it once runs llguidance's one-time lexer setup."""


def prepare_guidance(tokenizer: TokenizerWrapper) -> float | None:
    """Build (and cache) the llguidance tokenizer of a model being loaded and compile a small grammar against it, so
    the first constrained request finds both done; returns the seconds it took, None when the tokenizer cannot be
    used for constrained decoding (a constrained request then fails with that reason, as before)."""
    started = time.perf_counter()
    try:
        guidance = guidance_tokenizer(tokenizer)
    except UnsupportedConstraintError as error:
        logger.info("no constrained decoding prepared: %s", error)
        return None
    LLMatcher(guidance.lltokenizer, LLMatcher.grammar_from_lark(_WARM_GRAMMAR), log_level=0)
    return time.perf_counter() - started
