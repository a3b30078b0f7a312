"""A loaded tokenizer without transformers' construction copies encodes, decodes and templates as before."""

import json
from pathlib import Path
from typing import Any, cast

import llguidance.hf
import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_tokenizer

from exo.worker.engines.mlx.model_loader import load_model_tokenizer
from exo.worker.engines.mlx.tokenizer_memory import BackendTokens, drop_construction_copies

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "models"

TEXTS = [
    "What is the weather in Paris?",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "naïve café — 東京 🙂 <|im_start|>user\n\tdef f(x):\n        return x",
    "",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _stock(path: Path) -> TokenizerWrapper:
    eos = json.loads((path / "config.json").read_text()).get("eos_token_id")
    return load_tokenizer(path, {"trust_remote_code": False}, eos_token_ids=eos)


def _hf(tokenizer: TokenizerWrapper) -> Any:
    return cast(Any, tokenizer._tokenizer)  # pyright: ignore[reportPrivateUsage]


def _detokenized(tokenizer: TokenizerWrapper, ids: list[int]) -> str:
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for token in ids:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text


@pytest.mark.parametrize("model", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_loaded_tokenizer_reads_and_writes_as_the_stock_one(model: str) -> None:
    path = FIXTURES / model
    stock, loaded = _stock(path), load_model_tokenizer(path)
    assert loaded.get_vocab() == stock.get_vocab()
    assert loaded.all_special_ids == stock.all_special_ids
    for text in TEXTS:
        ids = loaded.encode(text)
        assert ids == stock.encode(text)
        assert loaded.decode(ids) == stock.decode(ids)
        assert _detokenized(loaded, ids) == _detokenized(stock, ids)
    messages = [{"role": "user", "content": TEXTS[0]}]
    templated = loaded.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert templated == stock.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    eos = sorted(loaded.eos_token_ids)
    guided, stock_guided = (llguidance.hf.from_tokenizer(_hf(t), eos_token=eos) for t in (loaded, stock))
    for text in TEXTS:
        assert guided.tokenize_str(text, parse_special=True) == stock_guided.tokenize_str(text, parse_special=True)
    assert guided.vocab_size == stock_guided.vocab_size


@pytest.mark.parametrize("model", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_the_streaming_detokenizer_reads_token_strings_from_the_backend(model: str) -> None:
    path = FIXTURES / model
    stock, loaded = _stock(path), load_model_tokenizer(path)
    stock_tokens = cast(Any, stock._detokenizer).tokenmap  # pyright: ignore[reportPrivateUsage]
    tokens = cast(Any, loaded._detokenizer).tokenmap  # pyright: ignore[reportPrivateUsage]
    assert isinstance(stock_tokens, list)
    assert isinstance(tokens, BackendTokens)
    assert len(tokens) == len(stock_tokens)
    assert [tokens[token] for token in range(len(tokens))] == stock_tokens
    with pytest.raises(IndexError):
        tokens[len(tokens)]


def test_the_qwen_tokenizer_loads_without_its_vocabulary_and_merges_copies() -> None:
    path = FIXTURES / "tiny-qwen-tools"
    stock = _stock(path)
    assert len(_hf(stock)._vocab) > 700  # the vocabulary without its added tokens
    assert len(_hf(stock)._merges) > 0
    assert drop_construction_copies(stock) == ["_vocab", "_merges"]
    assert (_hf(stock)._vocab, _hf(stock)._merges) == ({}, [])
    loaded = load_model_tokenizer(path)
    assert (_hf(loaded)._vocab, _hf(loaded)._merges) == ({}, [])


def test_a_tokenizer_without_a_rust_backend_keeps_what_it_holds() -> None:
    stock = _stock(FIXTURES / "tiny-qwen-tools")
    hf = _hf(stock)
    vocabulary = hf._vocab
    hf._tokenizer = None
    try:
        assert drop_construction_copies(stock) == []
        assert hf._vocab is vocabulary
    finally:
        hf._tokenizer = _hf(_stock(FIXTURES / "tiny-qwen-tools"))._tokenizer
