"""A streamed answer kept alive through its prefill starts with an empty text block when the model then called a
tool; Claude Code sends that message back as history. exo must accept it and render it exactly as the same turn
without the empty block, so the next turn's prompt still extends the previous one token for token (what the prefix
cache reuses between turns).
"""

from pathlib import Path
from typing import Any

from exo.api.adapters import messages_request
from exo.api.types.anthropic_messages import MessagesRequest
from exo.shared.types.common import ModelId
from exo.shared.types.tasks import GenerationParams
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.chat_template import apply_chat_template
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR

MODEL = ModelId("tiny-qwen-claude-code")
WRITE_TOOL: dict[str, Any] = {
    "name": "Write",
    "description": "Write a file.",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["file_path", "content"],
    },
}
ASK: dict[str, Any] = {"role": "user", "content": "Create the file hello.txt containing hello"}
CALL: dict[str, Any] = {
    "type": "tool_use",
    "id": "call_aaaaaaaaaaaaaaaaaaaaaaa1",
    "name": "Write",
    "input": {"file_path": "hello.txt", "content": "hello"},
}
RESULT: dict[str, Any] = {
    "role": "user",
    "content": [{"type": "tool_result", "tool_use_id": CALL["id"], "content": "File created successfully"}],
}


def params(*messages: dict[str, Any]) -> GenerationParams:
    body = {"model": MODEL, "max_tokens": 64, "system": "You are a coding agent.", "tools": [WRITE_TOOL]}
    request = MessagesRequest.model_validate({**body, "messages": list(messages)})
    return messages_request.to_command(request, MODEL).params


def test_an_empty_text_block_before_a_tool_use_renders_as_the_call_alone_and_extends_the_last_prompt() -> None:
    kept_alive = params(ASK, {"role": "assistant", "content": [{"type": "text", "text": ""}, CALL]}, RESULT)
    plain = params(ASK, {"role": "assistant", "content": [CALL]}, RESULT)
    assert kept_alive == plain

    loaded = load_model(Path(FIXTURE_MODELS_DIR / MODEL), ShardAssignment())
    first = params(ASK)
    first_prompt = apply_chat_template(loaded.tokenizer, first.messages, first.tool_policy)
    second_prompt = apply_chat_template(loaded.tokenizer, kept_alive.messages, kept_alive.tool_policy)
    # The model's answer (a call and nothing else) follows the first prompt directly: no empty line or empty
    # content where the text block was, so the first request's tokens are a prefix of the second's.
    assert second_prompt.text.startswith(first_prompt.text + "<tool_call>\n")
    assert second_prompt.tokens[: len(first_prompt.tokens)] == first_prompt.tokens
