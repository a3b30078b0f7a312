"""Sampling knobs and chat-template variables from the request reach the task (or are refused with a 400)."""

import pytest

from exo.api.adapters.chat_request import to_command
from exo.api.errors import ApiError
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.shared.types.common import ModelId
from exo.shared.types.tasks import SamplingParams

MODEL = ModelId("m")
MESSAGES = [{"role": "user", "content": "Hello!"}]


def request(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})


def test_vllm_style_sampling_knobs_are_carried_to_the_runner() -> None:
    body = request(top_k=20, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=-0.5)
    sampling = to_command(body, MODEL).params.sampling
    assert (sampling.top_k, sampling.min_p) == (20, 0.05)
    assert (sampling.repetition_penalty, sampling.presence_penalty, sampling.frequency_penalty) == (1.1, 0.5, -0.5)


def test_absent_knobs_leave_sampling_untouched() -> None:
    assert to_command(request(), MODEL).params.sampling == SamplingParams()


def test_top_k_minus_one_means_no_limit_as_in_vllm() -> None:
    assert to_command(request(top_k=-1), MODEL).params.sampling.top_k == 0


def test_chat_template_kwargs_reach_the_task() -> None:
    command = to_command(request(chat_template_kwargs={"enable_thinking": False}), MODEL)
    assert command.params.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("reserved", ["tools", "add_generation_prompt", "messages"])
def test_chat_template_kwargs_may_not_override_what_exo_renders(reserved: str) -> None:
    with pytest.raises(ApiError) as raised:
        to_command(request(chat_template_kwargs={reserved: True}), MODEL)
    assert raised.value.status_code == 400
    assert reserved in str(raised.value)
