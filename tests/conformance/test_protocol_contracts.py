"""The Messages and Responses stream checkers pass what the encoders send and catch each broken promise."""

import copy
from collections.abc import Callable

import pytest

from exo.api.adapters.messages_stream import MessageStreamEncoder
from exo.api.adapters.responses_stream import ResponseStreamEncoder
from exo.api.types.anthropic_stream_events import ContentBlockStopEvent
from exo.api.types.openai_responses_events import ArgumentsDeltaEvent
from exo.conformance import cli
from exo.conformance.messages_contract import check_messages_stream
from exo.conformance.responses_contract import check_responses_stream
from tests.conformance.protocol_streams import CALL_ID, Event, body, messages_events, position_of, responses_events

Edit = Callable[[list[Event]], None]


def rules(violations: tuple[object, ...]) -> set[str]:
    return {violation.rule for violation in violations}  # pyright: ignore[reportAttributeAccessIssue]


def test_the_encoders_streams_pass_and_summarise_what_a_client_reads() -> None:
    for checked in (check_messages_stream(body(messages_events())), check_responses_stream(body(responses_events()))):
        assert checked.violations == ()
        summary = checked.summary
        assert (summary.reasoning, summary.content) == ("Paris, then.", "Checking.")
        assert [(call.call_id, call.name, call.arguments) for call in summary.calls] == [
            (CALL_ID, "get_weather", '{"city": "Paris"}')
        ]


def _rename_first_delta(events: list[Event]) -> None:
    events[position_of(events, "content_block_delta")] = ("text", events[position_of(events, "content_block_delta")][1])


def _drop_first_stop(events: list[Event]) -> None:
    del events[position_of(events, "content_block_stop")]


def _skip_an_index(events: list[Event]) -> None:
    for name, data in events:
        if name.startswith("content_block") and data["index"] == 2:
            data["index"] = 3


def _say_end_turn(events: list[Event]) -> None:
    events[position_of(events, "message_delta")][1]["delta"]["stop_reason"] = "end_turn"


def _break_the_input(events: list[Event]) -> None:
    events[position_of(events, "content_block_delta", 3)][1]["delta"]["partial_json"] = '"Paris"'


def _prefill_the_input(events: list[Event]) -> None:
    events[position_of(events, "content_block_start", 2)][1]["content_block"]["input"] = {"city": "Rome"}


def _text_delta_in_tool_block(events: list[Event]) -> None:
    events[position_of(events, "content_block_delta", 2)][1]["delta"] = {"type": "text_delta", "text": "x"}


def _no_message_stop(events: list[Event]) -> None:
    events.pop()


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        (_rename_first_delta, "messages:event-name"),
        (_drop_first_stop, "messages:blocks"),
        (_skip_an_index, "messages:blocks"),
        (_say_end_turn, "messages:stop-reason"),
        (_break_the_input, "messages:tool-input-json"),
        (_prefill_the_input, "messages:block-start"),
        (_text_delta_in_tool_block, "messages:delta-kind"),
        (_no_message_stop, "messages:order"),
    ],
)
def test_the_messages_checker_catches(edit: Edit, rule: str) -> None:
    events = copy.deepcopy(messages_events())
    edit(events)
    assert rule in rules(check_messages_stream(body(events)).violations)


def test_the_anthropic_sdk_reading_is_checked_too() -> None:
    # A stream the walker reads happily but that is not the SDK's type: message_start usage without its counts.
    events = copy.deepcopy(messages_events())
    events[position_of(events, "message_start")][1]["message"]["usage"] = {}
    assert "messages:sdk-types" in rules(check_messages_stream(body(events)).violations)


def _gap_in_sequence(events: list[Event]) -> None:
    del events[position_of(events, "response.content_part.added")]


def _never_closed(events: list[Event]) -> None:
    del events[position_of(events, "response.output_item.done", 2)]


def _done_text_differs(events: list[Event]) -> None:
    events[position_of(events, "response.output_text.done")][1]["text"] = "Something else."


def _no_completion(events: list[Event]) -> None:
    events.pop()


def _arguments_prefilled(events: list[Event]) -> None:
    events[position_of(events, "response.output_item.added", 2)][1]["item"]["arguments"] = "{}"


def _final_output_misses_an_item(events: list[Event]) -> None:
    del events[-1][1]["response"]["output"][0]


def _delta_for_another_item(events: list[Event]) -> None:
    events[position_of(events, "response.function_call_arguments.delta")][1]["item_id"] = "fc_other"


def _no_usage(events: list[Event]) -> None:
    events[-1][1]["response"]["usage"] = None


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        (_gap_in_sequence, "responses:sequence"),
        (_never_closed, "responses:items"),
        (_done_text_differs, "responses:done-text"),
        (_no_completion, "responses:lifecycle"),
        (_arguments_prefilled, "responses:added-empty"),
        (_final_output_misses_an_item, "responses:final-output"),
        (_delta_for_another_item, "responses:items"),
        (_no_usage, "responses:usage"),
    ],
)
def test_the_responses_checker_catches(edit: Edit, rule: str) -> None:
    events = copy.deepcopy(responses_events())
    edit(events)
    assert rule in rules(check_responses_stream(body(events)).violations)


def test_the_openai_sdk_reading_is_checked_too() -> None:
    events = copy.deepcopy(responses_events())
    del events[position_of(events, "response.output_text.delta")][1]["logprobs"]
    assert "responses:sdk-types" in rules(check_responses_stream(body(events)).violations)


def test_a_broken_messages_encoder_fails_the_conformance_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    original = MessageStreamEncoder.encode
    monkeypatch.setattr(
        MessageStreamEncoder,
        "encode",
        lambda self, chunk: [e for e in original(self, chunk) if not isinstance(e, ContentBlockStopEvent)],  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    )
    assert cli.main(["--format", "hermes"]) == 1
    assert "messages:blocks" in capsys.readouterr().out


def test_a_broken_responses_encoder_fails_the_conformance_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    original = ResponseStreamEncoder.encode
    monkeypatch.setattr(
        ResponseStreamEncoder,
        "encode",
        lambda self, chunk: [e for e in original(self, chunk) if not isinstance(e, ArgumentsDeltaEvent)],  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    )
    assert cli.main(["--format", "hermes", "--json"]) == 1
    assert "responses:done-text" in capsys.readouterr().out
