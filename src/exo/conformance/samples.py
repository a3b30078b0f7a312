"""Representative model outputs for every tool-call format, written as each family's chat template asks.

Each format has a renderer from calls to model text (its markers, its way of writing arguments); the cases
are built from it: one call, two parallel calls, a call after content, the parallel text again fed in
1–3 character segments (markers split across "tokens"), a call after a reasoning block that itself shows a
call (which must stay reasoning), a think block written after content and one after a call (both plain
content: reasoning opens only at the start of the reply), and a call to a tool the request does not have
(which must come back as content, raw). A few formats add the marker-less forms their models also produce
(a bare JSON object, a bare pythonic list).
"""

from collections.abc import Sequence
from itertools import cycle

from exo.conformance.renderers import RENDERERS, SampleCall, json_call, pythonic_list
from exo.shared.types.common import FrozenModel
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls import ToolFormatName

WEATHER_TOOL = ToolSpec(
    name="get_weather",
    description="Current weather and forecast for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
CONTENT_BEFORE_CALL = "Let me check the weather."
LATE_THINK_BLOCK = "<think>Rome is cooler.</think>"
"""Think markers after the answer began: plain content (reasoning only opens at the start of the reply)."""


class ConformanceCase(FrozenModel):
    """One model output, how it is fed to the parser, and what the client must end up with."""

    tool_format: ToolFormatName
    case: str
    segments: tuple[str, ...]
    calls: tuple[SampleCall, ...]
    content: str = ""
    reasoning: str = ""
    malformed: bool = False
    """The output is deliberately not a usable call: the parser must note why (and nothing else may fail)."""


PARIS = SampleCall(name="get_weather", arguments={"city": "Paris"})
ROME = SampleCall(name="get_weather", arguments={"city": "Rome", "days": 3})
UNKNOWN = SampleCall(name="get_stock_price", arguments={"city": "Paris"})


# Marker-less forms: models of these families also answer with a bare call at the very start of the reply.
_BARE_FORMS: dict[ToolFormatName, tuple[str, tuple[SampleCall, ...]]] = {
    ToolFormatName.HERMES: (json_call(PARIS), (PARIS,)),
    ToolFormatName.LLAMA3_JSON: (json_call(PARIS, "parameters"), (PARIS,)),
    ToolFormatName.PYTHONIC: (pythonic_list([PARIS, ROME]), (PARIS, ROME)),
}


def small_segments(text: str) -> tuple[str, ...]:
    """`text` cut into pieces of 1, 2, 3, 1, 2, 3… characters: every marker ends up split somewhere."""
    pieces: list[str] = []
    position = 0
    for size in cycle((1, 2, 3)):
        if position >= len(text):
            break
        pieces.append(text[position : position + size])
        position += size
    return tuple(pieces)


_HARMONY_CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
# Forms only one family writes: harmony's channels (analysis is reasoning, final is the answer) and its recipient
# written before the channel, as GPT-OSS's own template renders earlier calls.
_OWN_CASES: dict[ToolFormatName, tuple[ConformanceCase, ...]] = {
    ToolFormatName.HARMONY: (
        ConformanceCase(
            tool_format=ToolFormatName.HARMONY,
            case="analysis_then_call",
            segments=small_segments(
                f"<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant{_HARMONY_CALL}"
            ),
            calls=(PARIS,),
            reasoning="Need the weather.",
        ),
        ConformanceCase(
            tool_format=ToolFormatName.HARMONY,
            case="analysis_then_final",
            segments=small_segments(
                "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.<|return|>"
            ),
            calls=(),
            reasoning="Easy.",
            content="Sunny.",
        ),
        ConformanceCase(
            tool_format=ToolFormatName.HARMONY,
            case="recipient_first",
            segments=small_segments(
                '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            ),
            calls=(PARIS,),
        ),
    ),
}


def cases_for(tool_format: ToolFormatName) -> list[ConformanceCase]:
    """The conformance cases of one format."""
    render = RENDERERS[tool_format]
    parallel = render([PARIS, ROME])
    thought = f"I could write {render([ROME])} but the user asked about Paris."
    unknown = render([UNKNOWN])
    cases = [
        ConformanceCase(tool_format=tool_format, case="single", segments=(render([PARIS]),), calls=(PARIS,)),
        ConformanceCase(tool_format=tool_format, case="parallel", segments=(parallel,), calls=(PARIS, ROME)),
        ConformanceCase(
            tool_format=tool_format,
            case="after_content",
            segments=(f"{CONTENT_BEFORE_CALL}\n{render([ROME])}",),
            calls=(ROME,),
            content=CONTENT_BEFORE_CALL,
        ),
        ConformanceCase(
            tool_format=tool_format, case="split_segments", segments=small_segments(parallel), calls=(PARIS, ROME)
        ),
        ConformanceCase(
            tool_format=tool_format,
            case="after_reasoning",
            segments=small_segments(f"<think>{thought}</think>\n{render([PARIS])}"),
            calls=(PARIS,),
            reasoning=thought,
        ),
        ConformanceCase(
            tool_format=tool_format,
            case="think_after_content",
            segments=small_segments(f"{CONTENT_BEFORE_CALL} {LATE_THINK_BLOCK}\n{render([ROME])}"),
            calls=(ROME,),
            content=f"{CONTENT_BEFORE_CALL} {LATE_THINK_BLOCK}",
        ),
        ConformanceCase(
            tool_format=tool_format,
            case="think_after_call",
            segments=small_segments(f"{render([PARIS])}{LATE_THINK_BLOCK}"),
            calls=(PARIS,),
            content=LATE_THINK_BLOCK,
        ),
        ConformanceCase(
            tool_format=tool_format,
            case="unknown_tool",
            segments=small_segments(unknown),
            calls=(),
            content=unknown,
            malformed=True,
        ),
    ]
    cases.extend(_OWN_CASES.get(tool_format, ()))
    if tool_format in _BARE_FORMS:
        text, calls = _BARE_FORMS[tool_format]
        cases.append(
            ConformanceCase(tool_format=tool_format, case="bare_split", segments=small_segments(text), calls=calls)
        )
    return cases


def all_cases(formats: Sequence[ToolFormatName] = tuple(ToolFormatName)) -> list[ConformanceCase]:
    """Every case of every format in `formats`, in format order."""
    return [case for tool_format in formats for case in cases_for(tool_format)]
