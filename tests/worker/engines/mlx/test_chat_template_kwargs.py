"""Client chat-template variables (`chat_template_kwargs`, e.g. Qwen3's `enable_thinking`) reach the template."""

from pathlib import Path

from exo.shared.types.tasks import PromptMessage, ToolPolicy
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.chat_template import apply_chat_template
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR

# The shape of Qwen3's switch: an empty think block closes reasoning before the answer when thinking is off.
THINKING_SWITCH_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
HELLO = (PromptMessage(role="user", content="Hello!"),)


def test_template_variables_change_the_rendered_prompt() -> None:
    loaded = load_model(Path(FIXTURE_MODELS_DIR / "tiny-qwen-tools"), ShardAssignment())
    loaded.tokenizer._tokenizer.chat_template = THINKING_SWITCH_TEMPLATE  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]

    # (mlx-lm passes enable_thinking=has_thinking by default, so the client's value must win over it.)
    thinking_on = apply_chat_template(loaded.tokenizer, HELLO, ToolPolicy(), {"enable_thinking": True})
    thinking_off = apply_chat_template(loaded.tokenizer, HELLO, ToolPolicy(), {"enable_thinking": False})

    assert "<think>" not in thinking_on.text
    assert thinking_off.text == thinking_on.text + "<think>\n\n</think>\n\n"
    assert thinking_off.tokens[: len(thinking_on.tokens)] == thinking_on.tokens
