"""The tools-first prompt layout: the tool block before the system text where the template allows it exactly, so
two projects whose system texts differ share the tools as a token prefix; the template's order everywhere else."""

from functools import cache
from pathlib import Path

from pydantic import JsonValue

from exo.shared.types.tasks import PromptMessage, ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.chat_template import RenderedPrompt, apply_chat_template
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.worker.engines.mlx.generator.scheduling import context_for, task

TOOLS = ToolPolicy(
    tools=(
        ToolSpec(
            name="write",
            description="Write a file.",
            parameters={
                "type": "object",
                "properties": {"filePath": {"type": "string"}, "content": {"type": "string"}},
                "required": ["filePath", "content"],
            },
        ),
    )
)


def _conversation(folder: str) -> tuple[PromptMessage, ...]:
    return (
        PromptMessage(role="system", content=f"You are a coding agent.\nWorking directory: {folder}"),
        PromptMessage(role="user", content="Create the file hello.txt containing hello"),
    )


@cache
def _model(name: str) -> LoadedModel:
    return load_model(Path(FIXTURE_MODELS_DIR / name), ShardAssignment())


def _render(name: str, messages: tuple[PromptMessage, ...], policy: ToolPolicy, layout: str) -> RenderedPrompt:
    return apply_chat_template(_model(name).tokenizer, messages, policy, layout=layout)  # pyright: ignore[reportArgumentType]


def _shared(first: list[int], second: list[int]) -> int:
    return next((index for index, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(first))


def test_qwen_puts_the_tool_block_first_in_the_system_turn_and_the_system_text_after_it() -> None:
    messages = _conversation("/home/a/project")
    template = _render("tiny-qwen-tools", messages, TOOLS, "template").text
    tools_first = _render("tiny-qwen-tools", messages, TOOLS, "tools-first").text

    system = str(messages[0].content)
    start = template.index("# Tools")
    end = template.index("<|im_end|>", start)
    block = template[start:end]
    assert template[:start].endswith(system + "\n\n")
    assert tools_first == template.replace(f"{system}\n\n{block}", f"{block}\n\n{system}")
    assert tools_first.startswith("<|im_start|>system\n# Tools")


def test_two_folders_share_the_tool_block_as_a_prefix_only_tools_first() -> None:
    here, there = _conversation("/home/a/project"), _conversation("/srv/b/other")
    template = [_render("tiny-qwen-tools", messages, TOOLS, "template").tokens for messages in (here, there)]
    tools_first = [_render("tiny-qwen-tools", messages, TOOLS, "tools-first").tokens for messages in (here, there)]

    tokenizer = _model("tiny-qwen-tools").tokenizer
    moved = _render("tiny-qwen-tools", here, TOOLS, "tools-first").text
    in_order = _render("tiny-qwen-tools", here, TOOLS, "template").text
    # Tools first, the folders part only after the whole tool block; in the template's order, at the folder.
    block_tokens = len(tokenizer.encode(moved[: moved.index("You are a coding agent.")]))
    before_folder = len(tokenizer.encode(in_order[: in_order.index("/home/a/project")]))
    assert _shared(*tools_first) >= block_tokens - 1
    assert _shared(*template) <= before_folder + 1
    assert block_tokens > 4 * before_folder
    assert len(tools_first[0]) == len(template[0])


def test_without_a_system_message_or_tools_the_template_order_stays() -> None:
    user_only = _conversation("/p")[1:]
    assert (
        _render("tiny-qwen-tools", user_only, TOOLS, "tools-first").text
        == _render("tiny-qwen-tools", user_only, TOOLS, "template").text
    )
    messages = _conversation("/p")
    assert (
        _render("tiny-qwen-tools", messages, ToolPolicy(), "tools-first").text
        == _render("tiny-qwen-tools", messages, ToolPolicy(), "template").text
    )


def test_llama_31_whose_tools_change_the_text_before_the_system_text_keeps_its_order() -> None:
    messages = _conversation("/p")
    assert (
        _render("tiny-llama31-tools", messages, TOOLS, "tools-first").text
        == _render("tiny-llama31-tools", messages, TOOLS, "template").text
    )


def test_a_template_that_trims_the_system_text_keeps_its_order() -> None:
    loaded = load_model(Path(FIXTURE_MODELS_DIR / "tiny-qwen-tools"), ShardAssignment())
    loaded.tokenizer._tokenizer.chat_template = (  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
        "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content | trim }}"
        "{% if loop.first and tools %}\n\n# Tools {{ tools | length }}{% endif %}<|im_end|>\n{% endfor %}"
    )
    padded = (PromptMessage(role="system", content="  padded  "), PromptMessage(role="user", content="hi"))

    moved = apply_chat_template(loaded.tokenizer, padded, TOOLS, layout="tools-first").text
    assert moved == apply_chat_template(loaded.tokenizer, padded, TOOLS).text
    assert moved.index("padded") < moved.index("# Tools")
    # Unpadded, the same template's tools are moved: the trim alone kept the order.
    plain = (PromptMessage(role="system", content="plain"), padded[1])
    moved = apply_chat_template(loaded.tokenizer, plain, TOOLS, layout="tools-first").text
    assert moved.index("# Tools") < moved.index("plain")


def test_the_runners_setting_lays_out_each_requests_prompt() -> None:
    body: dict[str, JsonValue] = {
        "messages": [
            {"role": "system", "content": "You are a coding agent.\nWorking directory: /p"},
            {"role": "user", "content": "Create the file hello.txt containing hello"},
        ],
        "tools": [{"type": "function", "function": TOOLS.tools[0].model_dump(mode="json", exclude_none=True)}],
    }
    loaded = _model("tiny-qwen-tools")
    request = task(body)
    prompts = {
        layout: ChatRequest.open(context_for(loaded, DecodeSettings(prompt_layout=layout)), request).prompt_tokens
        for layout in ("template", "tools-first")
    }

    messages = request.params.messages
    assert (
        prompts["tools-first"] == _render("tiny-qwen-tools", messages, request.params.tool_policy, "tools-first").tokens
    )
    assert prompts["template"] == _render("tiny-qwen-tools", messages, request.params.tool_policy, "template").tokens
    assert prompts["tools-first"] != prompts["template"]
