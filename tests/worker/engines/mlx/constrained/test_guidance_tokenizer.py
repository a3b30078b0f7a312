"""The llguidance tokenizer a model keeps reads tokens exactly as llguidance's own reading of the model's tokenizer
(every token's bytes, the special tokens, the end tokens) and tokenizes text as the model's tokenizer does, through
that tokenizer rather than a second copy of it."""

from pathlib import Path

import llguidance.hf
import pytest
from llguidance import LLMatcher
from mlx_lm.tokenizer_utils import load as load_tokenizer

from exo.worker.engines.mlx.constrained.compiled import GuidanceTokenizer

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "models"
TEXTS = (
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/main.py"}}\n</tool_call>',
    "naïve café — 東京 🙂 <|im_end|>\n\tdef f(x):\n        return x",
)


@pytest.mark.parametrize("model", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_the_kept_tokenizer_reads_tokens_as_llguidance_does_and_tokenizes_as_the_model(model: str) -> None:
    tokenizer = load_tokenizer(FIXTURES / model)
    hf_tokenizer = tokenizer._tokenizer  # pyright: ignore[reportPrivateUsage]
    eos_ids = sorted(tokenizer.eos_token_ids)
    kept = GuidanceTokenizer(tokenizer).lltokenizer
    own = llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=eos_ids)
    assert kept.vocab_size == own.vocab_size
    assert kept.eos_tokens == own.eos_tokens
    for token in range(own.vocab_size):
        assert kept.decode_bytes([token]) == own.decode_bytes([token]), token
        assert kept.is_special_token(token) == own.is_special_token(token), token
    for text in TEXTS:
        assert kept.tokenize_str(text) == hf_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    # A grammar's forced text is tokenized by it: the fast-forwarded tokens spell the forced string.
    matcher = LLMatcher(
        kept, LLMatcher.grammar_from_lark('start: "{\\"name\\": \\"read_file\\"" /[a-z]+/'), log_level=0
    )
    forced = matcher.compute_ff_tokens()
    assert forced
    assert kept.decode_str(forced) == '{"name": "read_file"'[: len(kept.decode_str(forced))]
