"""Model text for sample calls in every tool-call format, written as each family's chat template writes calls."""

import json
from collections.abc import Callable, Mapping, Sequence

from exo.shared.types.common import FrozenModel
from exo.tool_calls import ToolFormatName


class SampleCall(FrozenModel):
    """A call the model means to make, as a client should receive it."""

    name: str
    arguments: Mapping[str, str | int]


Renderer = Callable[[Sequence[SampleCall]], str]


def json_arguments(call: SampleCall) -> str:
    return json.dumps(dict(call.arguments))


def json_call(call: SampleCall, arguments_key: str = "arguments") -> str:
    return json.dumps({"name": call.name, arguments_key: dict(call.arguments)})


def _python_value(value: str | int) -> str:
    return repr(value)


def _hermes(calls: Sequence[SampleCall]) -> str:
    return "\n".join(f"<tool_call>\n{json_call(call)}\n</tool_call>" for call in calls)


def _llama3(calls: Sequence[SampleCall]) -> str:
    return "<|python_tag|>" + "; ".join(json_call(call, "parameters") for call in calls) + "<|eom_id|>"


def _mistral(calls: Sequence[SampleCall]) -> str:
    return "[TOOL_CALLS][" + ", ".join(json_call(call) for call in calls) + "]"


def pythonic_list(calls: Sequence[SampleCall]) -> str:
    rendered = (
        f"{call.name}({', '.join(f'{key}={_python_value(value)}' for key, value in call.arguments.items())})"
        for call in calls
    )
    return "[" + ", ".join(rendered) + "]"


def _pythonic(calls: Sequence[SampleCall]) -> str:
    return f"<|tool_call_start|>{pythonic_list(calls)}<|tool_call_end|>"


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
        f"{json_arguments(call)}<|tool_call_end|>"
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


def _harmony(calls: Sequence[SampleCall]) -> str:
    # `<|call|>` ends the turn; a second call is the next message after it, as a model continuing would write it.
    return "<|start|>assistant".join(
        f"<|channel|>commentary to=functions.{call.name} <|constrain|>json<|message|>{json_arguments(call)}<|call|>"
        for call in calls
    )


def _deepseek_v31(calls: Sequence[SampleCall]) -> str:
    body = "".join(
        f"<｜tool▁call▁begin｜>{call.name}<｜tool▁sep｜>{json_arguments(call)}<｜tool▁call▁end｜>" for call in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _deepseek_v32(calls: Sequence[SampleCall]) -> str:
    def one(call: SampleCall) -> str:
        parameters = "".join(
            f'<｜DSML｜parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
            f"{value}</｜DSML｜parameter>\n"
            for key, value in call.arguments.items()
        )
        return f'<｜DSML｜invoke name="{call.name}">\n{parameters}</｜DSML｜invoke>\n'

    return "<｜DSML｜function_calls>\n" + "".join(one(call) for call in calls) + "</｜DSML｜function_calls>"


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
    ToolFormatName.HARMONY: _harmony,
    ToolFormatName.DEEPSEEK_V31: _deepseek_v31,
    ToolFormatName.DEEPSEEK_V32: _deepseek_v32,
}
