"""A prompt far past the context is refused after tokenising about what fits, with a count that is a true lower
bound; a prompt that fits is tokenised exactly as before. Real tokenizer (tiny-qwen-tools)."""

import random
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from exo.worker.engines.mlx.prompt_budget import (
    CHARACTERS_PER_TOKEN_CAP,
    ContextLengthExceededError,
    _pieces,  # pyright: ignore[reportPrivateUsage]
    encode_within,
)
from tests.exo_server import fixture_model, running_exo
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, GREETING_REPLY

WORDS = ["weather", "Paris", "tool", "call", "the", "city", "temperature", "{", "}", "\n", "42", "é", "中文"]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(FIXTURE_MODELS_DIR / "tiny-qwen-tools")


class CountingEncoder:
    """The tokenizer's encode, recording how many characters it was asked to tokenise."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self.characters = 0

    def __call__(self, text: str) -> list[int]:
        self.characters += len(text)
        return list(self._tokenizer.encode(text, add_special_tokens=False))


def prose(words: int, seed: int = 0) -> str:
    chooser = random.Random(seed)
    return " ".join(chooser.choice(WORDS) for _ in range(words))


def test_a_prompt_far_past_the_context_is_refused_after_reading_about_what_fits(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    text = prose(2_000_000)  # ~9 MB
    encoder = CountingEncoder(tokenizer)
    refusal = r"the prompt is more than \d+ tokens but the model's context is 4096 tokens"
    with pytest.raises(ContextLengthExceededError, match=refusal):
        encode_within(encoder, text, 4096)
    assert encoder.characters < 100_000  # about what 4096 tokens take, not the 9 MB


def test_a_prompt_that_fits_is_tokenised_in_one_call_exactly(tokenizer: PreTrainedTokenizerBase) -> None:
    text = prose(500)
    encoder = CountingEncoder(tokenizer)
    assert encode_within(encoder, text, 4096) == tokenizer.encode(text, add_special_tokens=False)
    assert encoder.characters == len(text)


def test_highly_repetitive_text_past_the_cap_that_still_fits_gets_its_exact_tokens(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    text = " temperature" * 2100  # 12 characters a token: past the cap, yet 2100 tokens
    assert len(text) > 4096 * CHARACTERS_PER_TOKEN_CAP
    assert encode_within(CountingEncoder(tokenizer), text, 4096) == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("seed", range(8))
def test_the_count_at_refusal_never_exceeds_the_real_count(tokenizer: PreTrainedTokenizerBase, seed: int) -> None:
    text = prose(6000, seed)
    context = 300
    with pytest.raises(ContextLengthExceededError) as refused:
        encode_within(CountingEncoder(tokenizer), text, context)
    reported = int(str(refused.value).split("more than ")[1].split(" ")[0])
    assert context <= reported <= len(tokenizer.encode(text, add_special_tokens=False))


def test_a_short_prompt_over_the_context_gets_its_exact_count(tokenizer: PreTrainedTokenizerBase) -> None:
    text = prose(200)
    exact = tokenizer.encode(text, add_special_tokens=False)
    context = len(text) // CHARACTERS_PER_TOKEN_CAP + 1
    assert len(exact) > context  # over the context, yet under the cap
    # Under the cap the whole prompt is tokenised; the caller's clamp reports its exact length.
    assert encode_within(CountingEncoder(tokenizer), text, context) == exact


@pytest.mark.parametrize("text", [prose(20000), "x" * 100_000, "a " * 30000, "é中" * 20000 + "\n"])
def test_pieces_cover_the_text_and_cut_before_whitespace_where_there_is_any(text: str) -> None:
    pieces = list(_pieces(text))
    assert "".join(pieces) == text
    for following in pieces[1:]:
        if " " in text:
            assert following[0] in " \n", following[:10]


def runner_memory_kib(pid: int) -> tuple[int, int]:
    """The runner process's resident and peak resident memory, in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


@pytest.mark.slow  # starts a real node
def test_a_real_node_refuses_an_8_mb_prompt_without_holding_its_tokens_and_keeps_serving(tmp_path: Path) -> None:
    hello = {"model": "tiny-qwen-tools", "messages": [{"role": "user", "content": "Hello!"}]}
    huge = {"model": "tiny-qwen-tools", "messages": [{"role": "user", "content": prose(1_600_000)}]}
    with running_exo([fixture_model("tiny-qwen-tools")], tmp_path, ["--max-request-mb", "16"]) as server:
        url = f"{server.base_url}/v1/chat/completions"
        assert httpx.post(url, json=hello, timeout=120).status_code == 200
        pid = server.runner()["pid"]
        assert isinstance(pid, int)
        _, peak_before = runner_memory_kib(pid)
        refused = httpx.post(url, json=huge, timeout=300)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        assert "the prompt is more than" in refused.json()["error"]["message"]
        _, peak_after = runner_memory_kib(pid)
        # Tokenising all 8 MB in one call peaked about 1.2 GB higher; reading what fits costs a few MB.
        assert peak_after - peak_before < 300 * 1024, (peak_before, peak_after)
        greeted = httpx.post(url, json=hello, timeout=120)
        assert greeted.status_code == 200
        assert greeted.json()["choices"][0]["message"]["content"] == GREETING_REPLY
