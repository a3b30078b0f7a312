"""Representative model outputs for every tool-call format, written as each family's chat template asks.

Each format has a renderer from calls to model text (its markers, its way of writing arguments); the cases
are built from it: one call, two parallel calls, a call after content, the parallel text again fed in
1–3 character segments (markers split across "tokens"), a call after a reasoning block that itself shows a
call (which must stay reasoning), a think block written after content and one after a call (both plain
content: reasoning opens only at the start of the reply), and a call to a tool the request does not have
(which must come back as content, raw). A few formats add the marker-less forms their models also produce
(a bare JSON object, a bare pythonic list).
"""

import json
from collections.abc import Callable, Mapping, Sequence
from itertools import cycle

from exo.shared.types.api import FunctionDefinition
from exo.shared.types.common import FrozenModel
from exo.tool_calls import ToolFormatName

WEATHER_TOOL = FunctionDefinition(
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


class SampleCall(FrozenModel):
    """A call the model means to make, as a client should receive it."""

    name: str
    arguments: Mapping[str, str | int]


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

Renderer = Callable[[Sequence[SampleCall]], str]


def _json_arguments(call: SampleCall) -> str:
    return json.dumps(dict(call.arguments))


def _json_call(call: SampleCall, arguments_key: str = "arguments") -> str:
    return json.dumps({"name": call.name, arguments_key: dict(call.arguments)})


def _python_value(value: str | int) -> str:
    return repr(value)


def _hermes(calls: Sequence[SampleCall]) -> str:
    return "\n".join(f"<tool_call>\n{_json_call(call)}\n</tool_call>" for call in calls)


def _llama3(calls: Sequence[SampleCall]) -> str:
    return "<|python_tag|>" + "; ".join(_json_call(call, "parameters") for call in calls) + "<|eom_id|>"


def _mistral(calls: Sequence[SampleCall]) -> str:
    return "[TOOL_CALLS][" + ", ".join(_json_call(call) for call in calls) + "]"


def _pythonic_list(calls: Sequence[SampleCall]) -> str:
    rendered = (
        f"{call.name}({', '.join(f'{key}={_python_value(value)}' for key, value in call.arguments.items())})"
        for call in calls
    )
    return "[" + ", ".join(rendered) + "]"


def _pythonic(calls: Sequence[SampleCall]) -> str:
    return f"<|tool_call_start|>{_pythonic_list(calls)}<|tool_call_end|>"


def _qwen3_coder(calls: Sequence[SampleCall]) -> str:
    def one(call: SampleCall) -> str:
        parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in call.arguments.items())
        return f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>"

    return "\n".join(one(call) for call in calls)


def _key_value_tags(prefix: str) -> Renderer:
    """GLM 4.7 / Laguna (`prefix` "") and LongCat (`prefix` "longcat_"): a name line, then key/value tags."""

    def render(calls: Sequence[SampleCall]) -> str:
        def one(call: SampleCall) -> str:
            pairs = "".join(
                f"<{prefix}arg_key>{key}</{prefix}arg_key>\n<{prefix}arg_value>{value}</{prefix}arg_value>\n"
                for key, value in call.arguments.items()
            )
            return f"<{prefix}tool_call>{call.name}\n{pairs}</{prefix}tool_call>"

        return "\n".join(one(call) for call in calls)

    return render


def _kimi_k2(calls: Sequence[SampleCall]) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{call.name}:{index}<|tool_call_argument_begin|>"
        f"{_json_arguments(call)}<|tool_call_end|>"
        for index, call in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def _kimi_k3(calls: Sequence[SampleCall]) -> str:
    def one(index: int, call: SampleCall) -> str:
        arguments = "".join(
            f'<|open|>argument key="{key}" type="{"string" if isinstance(value, str) else "integer"}"<|sep|>'
            f"{value}<|close|>argument<|sep|>"
            for key, value in call.arguments.items()
        )
        return f'<|open|>call tool="{call.name}" index="{index + 1}"<|sep|>{arguments}<|close|>call<|sep|>'

    return (
        "<|open|>tools<|sep|>"
        + "".join(one(index, call) for index, call in enumerate(calls))
        + ("<|close|>tools<|sep|>")
    )


def _minimax_m2(calls: Sequence[SampleCall]) -> str:
    def one(call: SampleCall) -> str:
        parameters = "".join(f'<parameter name="{key}">{value}</parameter>\n' for key, value in call.arguments.items())
        return f'<invoke name="{call.name}">\n{parameters}</invoke>\n'

    return "<minimax:tool_call>\n" + "".join(one(call) for call in calls) + "</minimax:tool_call>"


def _gemma_like(start: str, end: str, quote: str) -> Renderer:
    """Gemma 4 and FunctionGemma: `call:name{key:value,…}`, strings between `quote` tokens."""

    def render(calls: Sequence[SampleCall]) -> str:
        def value_text(value: str | int) -> str:
            return f"{quote}{value}{quote}" if isinstance(value, str) else str(value)

        def one(call: SampleCall) -> str:
            pairs = ",".join(f"{key}:{value_text(value)}" for key, value in call.arguments.items())
            return f"{start}call:{call.name}{{{pairs}}}{end}"

        return "".join(one(call) for call in calls)

    return render


def _minicpm5(calls: Sequence[SampleCall]) -> str:
    def one(call: SampleCall) -> str:
        parameters = "".join(f'<param name="{key}">{value}</param>' for key, value in call.arguments.items())
        return f'<function name="{call.name}">{parameters}</function>'

    return "".join(one(call) for call in calls)


def _muse_spark(calls: Sequence[SampleCall]) -> str:
    def one(call: SampleCall) -> str:
        parameters = "".join(
            f'<atem:parameter name="{key}">{value}</atem:parameter>' for key, value in call.arguments.items()
        )
        return f'<atem:invoke name="{call.name}">{parameters}</atem:invoke>'

    return "<atem:function_calls>" + "".join(one(call) for call in calls) + "</atem:function_calls>"


RENDERERS: dict[ToolFormatName, Renderer] = {
    ToolFormatName.HERMES: _hermes,
    ToolFormatName.GENERIC: _hermes,
    ToolFormatName.LLAMA3_JSON: _llama3,
    ToolFormatName.MISTRAL: _mistral,
    ToolFormatName.PYTHONIC: _pythonic,
    ToolFormatName.QWEN3_CODER: _qwen3_coder,
    ToolFormatName.GLM47: _key_value_tags(""),
    ToolFormatName.LAGUNA: _key_value_tags(""),
    ToolFormatName.LONGCAT: _key_value_tags("longcat_"),
    ToolFormatName.KIMI_K2: _kimi_k2,
    ToolFormatName.KIMI_K3: _kimi_k3,
    ToolFormatName.MINIMAX_M2: _minimax_m2,
    ToolFormatName.GEMMA4: _gemma_like("<|tool_call>", "<tool_call|>", '<|"|>'),
    ToolFormatName.FUNCTION_GEMMA: _gemma_like("<start_function_call>", "<end_function_call>", "<escape>"),
    ToolFormatName.MINICPM5: _minicpm5,
    ToolFormatName.MUSE_SPARK: _muse_spark,
}

# Marker-less forms: models of these families also answer with a bare call at the very start of the reply.
_BARE_FORMS: dict[ToolFormatName, tuple[str, tuple[SampleCall, ...]]] = {
    ToolFormatName.HERMES: (_json_call(PARIS), (PARIS,)),
    ToolFormatName.LLAMA3_JSON: (_json_call(PARIS, "parameters"), (PARIS,)),
    ToolFormatName.PYTHONIC: (_pythonic_list([PARIS, ROME]), (PARIS, ROME)),
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
    if tool_format in _BARE_FORMS:
        text, calls = _BARE_FORMS[tool_format]
        cases.append(
            ConformanceCase(tool_format=tool_format, case="bare_split", segments=small_segments(text), calls=calls)
        )
    return cases


def all_cases(formats: Sequence[ToolFormatName] = tuple(ToolFormatName)) -> list[ConformanceCase]:
    """Every case of every format in `formats`, in format order."""
    return [case for tool_format in formats for case in cases_for(tool_format)]
