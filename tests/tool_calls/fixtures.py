"""Model outputs in every supported format, written the way each family's chat template asks for them."""

from collections.abc import Mapping

from exo.tool_calls import ToolFormatName as Format

from .support import Fixture

_HERMES = ("<tool_call>", "</tool_call>")
_PARIS: tuple[str, Mapping[str, object]] = ("get_weather", {"city": "Paris"})
_ROME_3: tuple[str, Mapping[str, object]] = ("get_weather", {"city": "Rome", "days": 3})

FIXTURES: list[Fixture] = [
    Fixture(
        "hermes_single",
        Format.HERMES,
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [_PARIS],
        content="Let me check.",
        markers=_HERMES,
    ),
    Fixture(
        "hermes_two_calls_parameters_key",
        Format.HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"parameters": {"city": "Rome", "days": 3}, "name": "get_weather"}\n</tool_call>',
        [_PARIS, _ROME_3],
        markers=_HERMES,
    ),
    Fixture(
        "hermes_string_arguments_and_nesting",
        Format.HERMES,
        '<tool_call>{"name": "get_weather", '
        '"arguments": "{\\"city\\": \\"Paris\\", \\"options\\": {\\"a\\": [1, {}]}}"}</tool_call>',
        [("get_weather", {"city": "Paris", "options": {"a": [1, {}]}})],
        markers=_HERMES,
    ),
    Fixture(
        "hermes_after_reasoning",
        Format.HERMES,
        '<think>The user wants <tool_call> weather.</think>\n\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris", "metric": "true"}}\n</tool_call>',
        [("get_weather", {"city": "Paris", "metric": True})],
        reasoning="The user wants <tool_call> weather.",
        markers=_HERMES,
    ),
    Fixture(
        "generic_write_with_escapes",
        Format.GENERIC,
        '<tool_call>{"name": "write", "arguments": {"path": "a.py", "content": "print(\\"hi\\")\\n\\u00e9 \\\\"}}'
        "</tool_call>",
        [("write", {"path": "a.py", "content": 'print("hi")\né \\'})],
        markers=_HERMES,
    ),
    Fixture(
        "raw_json_whole_reply",
        Format.HERMES,
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        [_PARIS],
    ),
    Fixture(
        "raw_json_fenced_list",
        Format.HERMES,
        '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome", "days": "3"}}]\n```',
        [_PARIS, _ROME_3],
        markers=("```",),
    ),
    Fixture(
        "llama3_python_tag_semicolons",
        Format.LLAMA3_JSON,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_weather", "parameters": {"city": "Rome", "days": 3}}<|eom_id|>',
        [_PARIS, _ROME_3],
        markers=("<|python_tag|>", "<|eom_id|>"),
    ),
    Fixture(
        "llama3_raw_json",
        Format.LLAMA3_JSON,
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        [_PARIS],
    ),
    Fixture(
        "mistral_json_list",
        Format.MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}]',
        [_PARIS, _ROME_3],
        markers=("[TOOL_CALLS]",),
    ),
    Fixture(
        "mistral_header_form",
        Format.MISTRAL,
        'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]'
        '{"city": "Rome", "days": 3}',
        [_PARIS, _ROME_3],
        content="Sure.",
        markers=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    ),
    Fixture(
        "pythonic_bare_list",
        Format.PYTHONIC,
        '[get_weather(city="Paris"), get_weather(city="Rome", days=3)]',
        [_PARIS, _ROME_3],
    ),
    Fixture(
        "pythonic_lfm_markers",
        Format.PYTHONIC,
        "Checking.<|tool_call_start|>[get_weather(city='Paris', options={\"a\": true})]<|tool_call_end|>Done.",
        [("get_weather", {"city": "Paris", "options": {"a": True}})],
        content="Checking.Done.",
        markers=("<|tool_call_start|>", "<|tool_call_end|>"),
    ),
    Fixture(
        "qwen3_coder_wrapped_out_of_order",
        Format.QWEN3_CODER,
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n3.0\n</parameter>\n<parameter=city>\nRome\n"
        "</parameter>\n<parameter=options>\n{'unit': 'C'}\n</parameter>\n</function>\n</tool_call>",
        [("get_weather", {"days": 3, "city": "Rome", "options": {"unit": "C"}})],
        markers=("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"),
    ),
    Fixture(
        "qwen3_coder_missing_wrapper_two_calls",
        Format.QWEN3_CODER,
        "I'll write it.\n<function=write>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\nline 1\n"
        'line "2"\n</parameter>\n</function>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
        "</function>",
        [("write", {"path": "a.txt", "content": 'line 1\nline "2"'}), _PARIS],
        content="I'll write it.",
        markers=("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"),
    ),
    Fixture(
        "qwen3_coder_with_hermes_json_inside",
        Format.QWEN3_CODER,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [_PARIS],
        markers=("<tool_call>", "</tool_call>"),
    ),
    Fixture(
        "glm47",
        Format.GLM47,
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>3</arg_value>\n</tool_call>",
        [_ROME_3],
        markers=_HERMES,
    ),
    Fixture(
        "kimi_k2",
        Format.KIMI_K2,
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1'
        '<|tool_call_argument_begin|>{"city": "Rome", "days": 3}<|tool_call_end|><|tool_calls_section_end|>',
        [_PARIS, _ROME_3],
        markers=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
    ),
    Fixture(
        "minimax_m2",
        Format.MINIMAX_M2,
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Rome</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>',
        [_ROME_3],
        markers=("<minimax:tool_call>", "</minimax:tool_call>"),
    ),
    Fixture(
        "gemma4",
        Format.GEMMA4,
        '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:3}<tool_call|>',
        [_ROME_3],
        markers=("<|tool_call>", "<tool_call|>"),
    ),
    Fixture(
        "function_gemma",
        Format.FUNCTION_GEMMA,
        "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>",
        [_PARIS],
        markers=("<start_function_call>", "<end_function_call>"),
    ),
    Fixture(
        "longcat",
        Format.LONGCAT,
        "<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n"
        "<longcat_arg_value>Paris</longcat_arg_value>\n</longcat_tool_call>",
        [_PARIS],
        markers=("<longcat_tool_call>", "</longcat_tool_call>"),
    ),
    Fixture(
        "content_only_with_angle_brackets",
        Format.HERMES,
        "Use a <b>tag</b> like <tool or <tool_cal and 3 < 4.",
        [],
        content="Use a <b>tag</b> like <tool or <tool_cal and 3 < 4.",
        markers=_HERMES,
    ),
]
