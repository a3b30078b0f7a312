"""Grammar text: which replies it accepts, for both tokenizations of the markers, and what it refuses to build."""

import logging

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.tool_calls.grammar.spec import ReasoningMarkers, ReplyShape, ToolConstraintSpec, UnsupportedConstraintError
from exo.tool_calls.names import ToolFormatName
from exo.tool_calls.request_grammar import build_tool_grammar, tool_marker_texts
from exo.worker.engines.mlx.constrained import make_logits_processor
from exo.worker.engines.mlx.constrained.compiled import guidance_tokenizer
from tests.worker.engines.mlx.constrained.conftest import LoadedModel, grammar_accepts
from tests.worker.engines.mlx.constrained.schemas import SEARCH, WEATHER

CALL_WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
CALL_SEARCH = '<tool_call>\n{"name": "search", "arguments": {"query": "x", "limit": 3}}\n</tool_call>'


def _accepts(tool_model: LoadedModel, spec: ToolConstraintSpec, reply: str) -> bool:
    """Whether the model's tokenization of the whole reply is a complete sentence of the grammar for `spec`."""
    guidance = guidance_tokenizer(tool_model[1])
    grammar = build_tool_grammar(spec, special_tokens=guidance.special_tokens(tool_marker_texts(spec)))
    return grammar_accepts(tool_model, grammar, reply)


def _spec(
    shape: ReplyShape,
    *,
    parallel: bool = True,
    named: bool = False,
    tool_format: ToolFormatName = ToolFormatName.HERMES,
) -> ToolConstraintSpec:
    """`named`: a named tool_choice as the policy hands it over (its one tool, one call)."""
    tools = (WEATHER,) if named else (WEATHER, SEARCH)
    return ToolConstraintSpec(
        tool_format=tool_format, tools=tools, shape=shape, parallel_tool_calls=parallel and not named
    )


def test_required_accepts_one_or_more_calls(tool_model: LoadedModel) -> None:
    spec = _spec(ReplyShape.CALLS)
    assert _accepts(tool_model, spec, CALL_WEATHER)
    assert _accepts(tool_model, spec, f"{CALL_WEATHER}\n{CALL_SEARCH}")


@pytest.mark.parametrize(
    "reply",
    [
        "I will not call a tool.",
        f"Sure. {CALL_WEATHER}",
        CALL_WEATHER.replace("get_weather", "delete_everything"),
        CALL_WEATHER.replace('"celsius"', '"kelvin"'),
        CALL_WEATHER.replace(', "unit": "celsius"', ""),
        CALL_WEATHER.replace('"unit"', '"extra": 1, "unit"'),
        CALL_WEATHER.removesuffix("</tool_call>"),
        f"{CALL_WEATHER}\nand some text",
    ],
)
def test_required_rejects_anything_but_valid_calls(tool_model: LoadedModel, reply: str) -> None:
    assert not _accepts(tool_model, _spec(ReplyShape.CALLS), reply)


def test_parallel_tool_calls_false_allows_exactly_one_call(tool_model: LoadedModel) -> None:
    spec = _spec(ReplyShape.CALLS, parallel=False)
    assert _accepts(tool_model, spec, CALL_WEATHER)
    assert not _accepts(tool_model, spec, f"{CALL_WEATHER}\n{CALL_SEARCH}")


def test_named_allows_only_that_tool_once(tool_model: LoadedModel) -> None:
    spec = _spec(ReplyShape.CALLS, named=True)
    assert _accepts(tool_model, spec, CALL_WEATHER)
    assert not _accepts(tool_model, spec, CALL_SEARCH)
    assert not _accepts(tool_model, spec, f"{CALL_WEATHER}\n{CALL_WEATHER}")


def test_strict_auto_allows_text_or_text_then_valid_calls(tool_model: LoadedModel) -> None:
    spec = _spec(ReplyShape.TEXT_OR_CALLS)
    assert _accepts(tool_model, spec, "Paris is sunny today.")
    assert _accepts(tool_model, spec, "")
    assert _accepts(tool_model, spec, f"Let me check.\n{CALL_WEATHER}\n{CALL_SEARCH}")
    assert not _accepts(tool_model, spec, f"Let me check. {CALL_WEATHER.replace('get_weather', 'rm')}")
    city_as_number = CALL_WEATHER.replace('"Paris"', "1")
    assert not _accepts(tool_model, spec, f"Let me check. {city_as_number}")


def test_llama3_json_is_one_bare_object_with_parameters(tool_model: LoadedModel) -> None:
    call = '{"name": "search", "parameters": {"query": "x", "limit": 3}}'
    required = _spec(ReplyShape.CALLS, tool_format=ToolFormatName.LLAMA3_JSON)
    assert _accepts(tool_model, required, call)
    assert not _accepts(tool_model, required, call.replace("parameters", "arguments"))
    assert not _accepts(tool_model, required, f"{call}{call}")
    strict = _spec(ReplyShape.TEXT_OR_CALLS, tool_format=ToolFormatName.LLAMA3_JSON)
    assert _accepts(tool_model, strict, "No call needed.")
    assert not _accepts(tool_model, strict, '{"name": "search", "parameters": {}}')


def test_llama3_json_accepts_the_python_tag_where_it_is_a_token(
    marker_token_model: LoadedModel, marker_text_model: LoadedModel
) -> None:
    tagged = '<|python_tag|>{"name": "search", "parameters": {"query": "x", "limit": 3}}'
    required = _spec(ReplyShape.CALLS, tool_format=ToolFormatName.LLAMA3_JSON)
    assert _accepts(marker_token_model, required, tagged)
    assert not _accepts(marker_text_model, required, tagged)


def test_markers_are_matched_as_added_tokens_only_where_they_are_tokens(
    marker_token_model: LoadedModel, marker_text_model: LoadedModel
) -> None:
    markers = ("<tool_call>", "</tool_call>", "<|im_end|>", "plain")
    token_ids = guidance_tokenizer(marker_token_model[1]).special_tokens(markers)
    assert set(token_ids) == {"<tool_call>", "</tool_call>", "<|im_end|>"}
    assert marker_token_model[1].decode([token_ids["<tool_call>"]]) == "<tool_call>"
    assert set(guidance_tokenizer(marker_text_model[1]).special_tokens(markers)) == {"<|im_end|>"}


def test_schema_llguidance_cannot_compile_is_refused() -> None:
    broken = WEATHER.model_copy(update={"parameters": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}})
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=(broken,), shape=ReplyShape.CALLS, parallel_tool_calls=True
    )
    with pytest.raises(UnsupportedConstraintError, match="llguidance"):
        build_tool_grammar(spec)


THINKING = ReasoningMarkers(start="<think>", end="</think>")


def test_reasoning_block_may_precede_required_calls(tool_model: LoadedModel) -> None:
    spec = _spec(ReplyShape.CALLS).model_copy(update={"reasoning": THINKING})
    assert _accepts(tool_model, spec, CALL_WEATHER)
    assert _accepts(tool_model, spec, f"<think>\nThe user wants weather: get_weather.\n</think>\n\n{CALL_WEATHER}")
    assert not _accepts(tool_model, spec, "<think>\nI will just answer.\n</think>\n\nIt is sunny.")
    assert not _accepts(tool_model, spec, "<think>\nnever closed")


def test_reasoning_opened_by_the_prompt_must_close_before_calls(tool_model: LoadedModel) -> None:
    spec = _spec(ReplyShape.CALLS, named=True).model_copy(
        update={"reasoning": THINKING.model_copy(update={"opened_in_prompt": True})}
    )
    assert _accepts(tool_model, spec, f"Weather, so get_weather.\n</think>\n\n{CALL_WEATHER}")
    assert not _accepts(tool_model, spec, CALL_WEATHER)


def test_strict_auto_leaves_reasoning_and_text_free(tool_model: LoadedModel) -> None:
    spec = _spec(ReplyShape.TEXT_OR_CALLS).model_copy(update={"reasoning": THINKING})
    assert _accepts(tool_model, spec, "<think>\nsimple\n</think>\n\nIt is sunny.")
    assert _accepts(tool_model, spec, f"<think>\nsimple\n</think>\n\n{CALL_SEARCH}")


def test_keywords_llguidance_cannot_enforce_are_relaxed_and_reported(
    tool_model: LoadedModel, caplog: pytest.LogCaptureFixture
) -> None:
    unique = WEATHER.model_copy(
        update={
            "parameters": {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
                "required": ["tags"],
            }
        }
    )
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=(unique,), shape=ReplyShape.CALLS, parallel_tool_calls=False
    )
    with caplog.at_level(logging.INFO, logger="exo.worker.engines.mlx.constrained.logits_processor"):
        make_logits_processor(tool_model[1], spec, prompt_length=0)
    assert "schema keywords not enforced" in caplog.text
    assert "uniqueItems" in caplog.text
    assert _accepts(
        tool_model, spec, '<tool_call>\n{"name": "get_weather", "arguments": {"tags": ["a"]}}\n</tool_call>'
    )
    assert not _accepts(
        tool_model, spec, '<tool_call>\n{"name": "get_weather", "arguments": {"tags": "a"}}\n</tool_call>'
    )


@pytest.mark.parametrize(
    ("shape", "parallel"), [(ReplyShape.TEXT_OR_CALLS, True), (ReplyShape.CALLS, True), (ReplyShape.CALLS, False)]
)
def test_a_strict_tool_with_a_keyword_llguidance_cannot_enforce_is_refused_not_relaxed(
    shape: ReplyShape, parallel: bool
) -> None:
    unique = WEATHER.model_copy(
        update={
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
                "required": ["tags"],
            },
        }
    )
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=(unique,), shape=shape, parallel_tool_calls=parallel
    )
    with pytest.raises(UnsupportedConstraintError, match="uniqueItems"):
        build_tool_grammar(spec)


def test_tokenizers_llguidance_cannot_read_are_refused(marker_text_model: LoadedModel) -> None:
    _, tokenizer = marker_text_model
    slow = TokenizerWrapper(tokenizer._tokenizer)  # pyright: ignore[reportPrivateUsage] -- a second wrapper
    # What a slow (pure Python) tokenizer looks like to llguidance: not a `tokenizers` one.
    slow._tokenizer = object()  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue] -- test double
    spec = _spec(ReplyShape.CALLS)
    with pytest.raises(UnsupportedConstraintError, match="tokenizer"):
        make_logits_processor(slow, spec, prompt_length=0)


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_releases_the_reply_after_a_call(tool_model: LoadedModel, parallel: bool) -> None:
    # After its call a model may end, or write text (it was pushed into a second call instead); only a call opened
    # in that text is held again, and only where parallel calls are allowed.
    spec = _spec(ReplyShape.TEXT_OR_CALLS, parallel=parallel)
    assert _accepts(tool_model, spec, CALL_WEATHER)
    assert _accepts(tool_model, spec, f"{CALL_WEATHER}\n\nI asked for the weather in Paris.")
    assert _accepts(tool_model, spec, f"{CALL_WEATHER}\n{CALL_SEARCH}") is parallel
    assert _accepts(tool_model, spec, f"{CALL_WEATHER}\nAnd now: {CALL_SEARCH}\nDone.") is parallel
    assert not _accepts(tool_model, spec, f"{CALL_WEATHER}\n{CALL_SEARCH.replace('search', 'rm')}")
