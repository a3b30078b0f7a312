"""Format detection from real-looking chat-template snippets, mlx-lm's tool_parser_type, and overrides."""

import pytest

from exo.tool_calls import ToolFormatName as Format
from exo.tool_calls import detect_tool_format

TEMPLATES = {
    "qwen2.5": (
        "{%- if tools %}\n{{- '<|im_start|>system\\n' }}\n{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions"
        " to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML"
        ' tags:\\n<tools>" }}\n{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}\n{{- "\\n</tools>\\n\\nFor'
        " each function call, return a json object with function name and arguments within <tool_call></tool_call>"
        ' XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
        '</tool_call><|im_end|>\\n" }}\n{%- endif %}{%- for tool_call in message.tool_calls %}'
        '{{- \'<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    ),
    "qwen3-coder": (
        "{%- for tool_call in message.tool_calls %}{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
        "{%- for args_name, args_value in tool_call.arguments|items %}{{- '<parameter=' + args_name + '>\\n' }}"
    ),
    "glm-4.7": "{% for tc in m.tool_calls %}<tool_call>{{ tc.name }}{% for k, v in tc.arguments.items() %}"
    "<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>{% endfor %}",
    "llama-3.1": (
        '{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}'
        "{{- '<|python_tag|>' + tool_call.name + '.call(' }}{{- '{\"name\": \"' + tool_call.name + '\", ' }}"
        '{{- \'"parameters": \' }}{{- tool_call.arguments | tojson }}{{- "<|eom_id|>" }}'
    ),
    "llama-3.2-pythonic": (
        "If you decide to invoke any of the function(s), you MUST put it in the format of "
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\\n"
    ),
    "mistral": "{%- if message.tool_calls %}{{- '[TOOL_CALLS][' }}{%- for tool in message.tool_calls %}",
    "kimi-k2": "<|tool_calls_section_begin|>{%- for tool_call in message['tool_calls'] -%}<|tool_call_begin|>",
    "minimax-m2": '<minimax:tool_call>\\n{% for tc in tool_calls %}<invoke name="{{ tc.name }}">',
    "gemma-4": "<|tool_call>call:{{ tool_call.name }}{{ args }}<tool_call|>",
    "function-gemma": "<start_function_call>call:{{ name }}{{ '{' }}{{ args }}{{ '}' }}<end_function_call>",
    "lfm2": "<|tool_list_start|>[{{ tools | tojson }}]<|tool_list_end|> ... <|tool_call_start|>",
    "plain-chat": "{% for message in messages %}{{ '<|user|>' + message['content'] }}{% endfor %}",
}
EXPECTED = {
    "qwen2.5": Format.HERMES,
    "qwen3-coder": Format.QWEN3_CODER,
    "glm-4.7": Format.GLM47,
    "llama-3.1": Format.LLAMA3_JSON,
    "llama-3.2-pythonic": Format.PYTHONIC,
    "mistral": Format.MISTRAL,
    "kimi-k2": Format.KIMI_K2,
    "minimax-m2": Format.MINIMAX_M2,
    "gemma-4": Format.GEMMA4,
    "function-gemma": Format.FUNCTION_GEMMA,
    "lfm2": Format.PYTHONIC,
    "plain-chat": Format.GENERIC,
}


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_the_format_is_detected_from_the_chat_template(family: str) -> None:
    assert detect_tool_format(TEMPLATES[family]) == EXPECTED[family]


def test_no_template_means_generic() -> None:
    assert detect_tool_format(None) == Format.GENERIC


def test_mlx_lm_tool_parser_type_wins_over_the_template_and_its_names_are_mapped() -> None:
    assert detect_tool_format(TEMPLATES["plain-chat"], tool_parser_type="json_tools") == Format.HERMES
    assert detect_tool_format(TEMPLATES["qwen2.5"], tool_parser_type="qwen3_coder") == Format.QWEN3_CODER


def test_an_override_wins_and_must_name_a_format() -> None:
    assert detect_tool_format(TEMPLATES["qwen2.5"], "qwen3_coder", override="mistral") == Format.MISTRAL
    with pytest.raises(ValueError, match="nonsense"):
        detect_tool_format(None, override="nonsense")
