"""The checker accepts streams that keep the contract and flags each failure peers were seen to make."""

import json
from collections.abc import Sequence

from exo.conformance.checker import check_stream, sse_payloads
from exo.conformance.contract import DONE_PAYLOAD, Violation, walk_stream
from exo.conformance.openai_crosscheck import openai_violations

from . import streams
from .streams import CALL_ID_0, CALL_ID_1


def stream_violations(payloads: Sequence[str], *, include_usage: bool) -> list[Violation]:
    return list(check_stream(payloads, include_usage=include_usage).violations)


def broken_rules(payloads: list[str], *, include_usage: bool = True) -> set[str]:
    return {violation.rule for violation in stream_violations(payloads, include_usage=include_usage)}


# ---- streams that keep the contract ------------------------------------------------------------------


def test_parallel_tool_calls_with_usage_pass_and_accumulate() -> None:
    checked = check_stream(streams.tool_call_stream(), include_usage=True)
    assert checked.violations == ()
    summary = checked.summary
    assert (summary.role, summary.content, summary.finish_reason) == ("assistant", "Checking.", "tool_calls")
    assert [(call.call_id, call.arguments) for call in summary.calls] == [
        (CALL_ID_0, '{"city": "Paris"}'),
        (CALL_ID_1, '{"city": "Rome", "days": 3}'),
    ]


def test_reasoning_then_content_without_usage_passes() -> None:
    payloads = [streams.role(), streams.reasoning("think"), streams.content("Hi"), streams.finish("stop"), DONE_PAYLOAD]
    checked = check_stream(payloads, include_usage=False)
    assert checked.violations == ()
    assert (checked.summary.reasoning, checked.summary.content) == ("think", "Hi")


def test_an_error_event_then_done_passes_without_finish_or_usage() -> None:
    payloads = [streams.role(), streams.content("partial"), streams.error(), DONE_PAYLOAD]
    checked = check_stream(payloads, include_usage=True)
    assert checked.violations == ()
    assert checked.summary.errored


def test_a_call_cut_off_by_max_tokens_may_end_with_length_and_unfinished_arguments() -> None:
    payloads = [
        streams.role(),
        streams.call_start(0, CALL_ID_0),
        streams.call_arguments(0, '{"city": "Par'),
        streams.finish("length"),
        streams.usage(),
        DONE_PAYLOAD,
    ]
    assert broken_rules(payloads) == set()


def test_sse_payloads_reads_the_data_lines_of_a_body() -> None:
    body = 'data: {"a": 1}\n\n: comment\n\ndata:{"b": 2}\r\n\r\ndata: [DONE]\n\n'
    assert sse_payloads(body) == ['{"a": 1}', '{"b": 2}', DONE_PAYLOAD]


# ---- failures seen in peers, one test each --------------------------------------------------------


def test_role_repeated_in_every_chunk_is_flagged_by_both_readers() -> None:
    payloads = streams.tool_call_stream()
    payloads[1] = streams.chunk({"role": "assistant", "content": "Checking."})
    rules = broken_rules(payloads)
    assert "2-role-once" in rules
    assert "openai-python" in rules  # openai-python accumulates "assistantassistant"


def test_a_missing_role_in_the_first_chunk_is_flagged() -> None:
    assert "2-role-once" in broken_rules(streams.tool_call_stream()[1:])


def test_id_and_name_repeated_in_argument_deltas_are_flagged() -> None:
    payloads = streams.tool_call_stream()
    repeated = {"index": 0, "id": CALL_ID_0, "type": "function", "function": {"name": "get_weather", "arguments": "1"}}
    payloads[4] = streams.chunk({"tool_calls": [repeated]})
    rules = broken_rules(payloads)
    assert "5-tool-call-later-delta" in rules
    assert "openai-python" in rules  # the id becomes call_…call_…


def test_a_first_delta_without_id_or_name_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[2] = streams.chunk({"tool_calls": [{"index": 0, "function": {"arguments": ""}}]})
    assert "4-tool-call-first-delta" in broken_rules(payloads)


def test_a_first_delta_with_a_placeholder_object_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    call = {"index": 0, "id": CALL_ID_0, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    payloads[2] = streams.chunk({"tool_calls": [call]})
    assert {"4-tool-call-first-delta", "6-parsable-prefix"} <= broken_rules(payloads)


def test_an_argument_delta_without_a_function_object_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[3] = streams.chunk({"tool_calls": [{"index": 0}]})
    assert "5-tool-call-later-delta" in broken_rules(payloads)


def test_an_argument_delta_without_index_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[3] = streams.chunk({"tool_calls": [{"function": {"arguments": '{"city": '}}]})
    assert "5-tool-call-later-delta" in broken_rules(payloads)


def test_duplicated_argument_fragments_are_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads.insert(5, streams.call_arguments(0, '"Paris"}'))
    assert {"6-parsable-prefix", "3-arguments-json"} <= broken_rules(payloads)


def test_truncated_arguments_with_finish_tool_calls_are_flagged() -> None:
    payloads = streams.tool_call_stream()
    del payloads[4]
    assert "3-arguments-json" in broken_rules(payloads)


def test_arguments_missing_their_prefix_are_flagged() -> None:
    payloads = streams.tool_call_stream()
    del payloads[3]
    assert "3-arguments-json" in broken_rules(payloads)


def test_parallel_calls_collapsed_onto_index_0_are_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[5] = streams.call_start(0, CALL_ID_1)
    payloads[6] = streams.call_arguments(0, '{"city": "Rome", "days": 3}')
    assert {"5-tool-call-later-delta", "6-parsable-prefix", "3-arguments-json"} <= broken_rules(payloads)


def test_indices_that_skip_are_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[5] = streams.call_start(2, CALL_ID_1)
    payloads[6] = streams.call_arguments(2, '{"city": "Rome", "days": 3}')
    assert "7-indices" in broken_rules(payloads)


def test_an_id_reused_by_a_second_call_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[5] = streams.call_start(1, CALL_ID_0)
    assert "7-indices" in broken_rules(payloads)


def test_format_native_ids_are_flagged() -> None:
    for native_id in ("a1b2c3d4e", "functions.get_weather:0"):
        payloads = streams.tool_call_stream()
        payloads[2] = streams.call_start(0, native_id)
        assert "4-tool-call-first-delta" in broken_rules(payloads), native_id


def test_finish_stop_after_tool_calls_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[7] = streams.finish("stop")
    assert "8-finish" in broken_rules(payloads)


def test_finish_tool_calls_without_a_call_is_flagged() -> None:
    payloads = [streams.role(), streams.content("Hi"), streams.finish("tool_calls"), streams.usage(), DONE_PAYLOAD]
    assert "8-finish" in broken_rules(payloads)


def test_a_stream_that_ends_without_finish_is_flagged() -> None:
    payloads = [streams.role(), streams.content("Hi"), streams.usage(), DONE_PAYLOAD]
    assert "8-finish" in broken_rules(payloads)


def test_a_second_finish_chunk_or_a_chunk_after_finish_is_flagged() -> None:
    payloads = [streams.role(), streams.finish("stop"), streams.content("more"), streams.finish("stop"), DONE_PAYLOAD]
    violations = stream_violations(payloads, include_usage=False)
    assert sum(violation.rule == "8-finish" for violation in violations) >= 2


def test_content_in_the_finish_chunk_is_flagged() -> None:
    payloads = [streams.role(), streams.chunk({"content": "Hi"}, "stop"), DONE_PAYLOAD]
    assert "8-finish" in broken_rules(payloads, include_usage=False)


def test_a_stream_without_done_is_flagged() -> None:
    assert "done" in broken_rules(streams.tool_call_stream()[:-1])


def test_missing_usage_when_asked_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    del payloads[8]
    assert "9-usage" in broken_rules(payloads)


def test_usage_when_not_asked_or_on_a_choice_chunk_is_flagged() -> None:
    assert "9-usage" in broken_rules(streams.tool_call_stream(), include_usage=False)
    payloads = streams.tool_call_stream()
    payloads[8] = streams.chunk({}, "tool_calls", usage=dict(streams.USAGE))
    del payloads[7]
    assert "9-usage" in broken_rules(payloads)


def test_malformed_usage_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[8] = streams.usage({**streams.USAGE, "total_tokens": 99, "prompt_tokens_details": None})
    violations = stream_violations(payloads, include_usage=True)
    assert sum(violation.rule == "9-usage" for violation in violations) == 2


def test_usage_before_the_finish_chunk_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[7], payloads[8] = payloads[8], payloads[7]
    assert "9-usage" in broken_rules(payloads)


def test_a_changing_id_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads[1] = streams.chunk({"content": "Checking."}, id="chatcmpl-2")
    assert "1-identity" in broken_rules(payloads)


def test_reasoning_after_content_is_flagged() -> None:
    payloads = [streams.role(), streams.content("Hi"), streams.reasoning("hmm"), streams.finish("stop"), DONE_PAYLOAD]
    assert "10-reasoning" in broken_rules(payloads, include_usage=False)


def test_content_after_an_error_event_is_flagged() -> None:
    payloads = [streams.role(), streams.error(), streams.content("more"), DONE_PAYLOAD]
    assert "11-error" in broken_rules(payloads)


def test_an_error_event_without_type_is_flagged() -> None:
    payloads = [streams.role(), json.dumps({"error": {"message": "boom"}}), DONE_PAYLOAD]
    assert "11-error" in broken_rules(payloads)


def test_a_payload_that_is_not_json_is_flagged() -> None:
    payloads = streams.tool_call_stream()
    payloads.insert(1, "{not json")
    assert "payload-json" in broken_rules(payloads)


def test_the_openai_crosscheck_alone_sees_a_concatenated_role() -> None:
    payloads = streams.tool_call_stream()
    payloads[1] = streams.chunk({"role": "assistant", "content": "Checking."})
    summary = walk_stream(payloads, include_usage=True).summary
    messages = [violation.message for violation in openai_violations(payloads, summary)]
    assert any("assistantassistant" in message for message in messages)
    assert (
        openai_violations(
            streams.tool_call_stream(), check_stream(streams.tool_call_stream(), include_usage=True).summary
        )
        == []
    )
