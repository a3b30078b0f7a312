"""Tiny random-weight models (both tool-marker tokenizations) loaded once per session."""

from pathlib import Path

import llguidance
import pytest
from llguidance import LLMatcher
from mlx import nn
from mlx_lm import load
from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.worker.engines.mlx.constrained.compiled import guidance_tokenizer
from tests.worker.engines.mlx.constrained.tiny_models import build_tool_model

LoadedModel = tuple[nn.Module, TokenizerWrapper]


def _load(directory: Path) -> LoadedModel:
    loaded = load(str(directory))
    return loaded[0], loaded[1]


@pytest.fixture(scope="session")
def marker_token_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """`<tool_call>` and `</tool_call>` are added tokens (as in Qwen's tokenizer)."""
    return _load(build_tool_model(tmp_path_factory.mktemp("marker-tokens"), markers_are_added_tokens=True))


@pytest.fixture(scope="session")
def marker_text_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The markers are plain text in ordinary BPE pieces (as in the default model's imported tokenizer)."""
    return _load(build_tool_model(tmp_path_factory.mktemp("marker-text"), markers_are_added_tokens=False))


@pytest.fixture(params=["marker-tokens", "marker-text"])
def tool_model(
    request: pytest.FixtureRequest, marker_token_model: LoadedModel, marker_text_model: LoadedModel
) -> LoadedModel:
    """Each test runs against both tokenizations of the tool markers."""
    return marker_token_model if request.param == "marker-tokens" else marker_text_model


def grammar_accepts(tool_model: LoadedModel, grammar: str, reply: str) -> bool:
    """Whether the whole reply, tokenized as the model would, is a complete sentence of the grammar."""
    _, tokenizer = tool_model
    matcher = LLMatcher(
        guidance_tokenizer(tokenizer).lltokenizer, llguidance.grammar_from("lark", grammar), log_level=0
    )
    tokens: list[int] = tokenizer.encode(reply)
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()
