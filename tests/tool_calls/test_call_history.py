"""What the loop guard reads from a conversation (`CallHistory`): which repeated calls are a real loop, which go
through, and what `warn` reports. Each conversation is one an agent sends; the guard acts only on a real loop."""

import pytest

from exo.shared.types.tasks import PromptMessage, PromptToolCall
from exo.tool_calls.loop_guard import (
    SAME_ERRORS,
    CallHistory,
    CallKey,
    error_result,
)

QUESTION = PromptMessage(role="user", content="Is job 42 done?")
STATUS: dict[str, object] = {"job": "42"}
SLEEP: dict[str, object] = {"seconds": 30}
POLL = CallKey.of("check_status", STATUS)


class Conversation:
    """A conversation built turn by turn: the user's question, then calls and their results."""

    def __init__(self) -> None:
        self.messages: list[PromptMessage] = [QUESTION]

    def call(self, name: str, arguments: dict[str, object], result: str | None) -> "Conversation":
        call_id = f"call_{len(self.messages)}"
        call = PromptToolCall(call_id=call_id, name=name, arguments=arguments)
        self.messages.append(PromptMessage(role="assistant", content="", tool_calls=(call,)))
        if result is not None:
            self.messages.append(PromptMessage(role="tool", content=result, tool_call_id=call_id))
        return self

    def poll(self, result: str) -> "Conversation":
        return self.call("check_status", STATUS, result)

    def user(self, text: str) -> "Conversation":
        self.messages.append(PromptMessage(role="user", content=text))
        return self

    def history(self) -> CallHistory:
        return CallHistory.of(self.messages)


def test_a_second_identical_status_poll_goes_through_and_warn_reports_it() -> None:
    history = Conversation().poll("running").history()
    assert not history.real_loop(POLL)
    assert history.looping_calls() == ()
    assert history.in_a_row(POLL) == 1
    (finding,) = history.findings([POLL])
    assert "identical call 2 in a row" in finding
    assert history.repeated([POLL]) == 1


def test_the_third_identical_call_after_identical_results_is_a_real_loop() -> None:
    history = Conversation().poll("running").poll("running").history()
    assert history.real_loop(POLL)
    assert history.looping_calls() == (POLL,)
    (finding,) = history.findings([POLL])
    assert "identical call 3 in a row" in finding
    assert "after identical results" in finding
    # Key order and spacing do not make a call new.
    assert history.real_loop(CallKey.of("check_status", '{ "job" :  "42" }'))
    # Whitespace around a result does not make it new either.
    assert Conversation().poll("running\n").poll(" running").history().real_loop(POLL)


def test_poll_sleep_poll_goes_through() -> None:
    history = Conversation().poll("running").call("sleep", SLEEP, "slept").poll("running").history()
    assert not history.real_loop(POLL)
    assert not history.real_loop(CallKey.of("sleep", SLEEP))
    assert history.looping_calls() == ()
    # And for as long as it goes on: the calls alternate, so no call is ever three in a row.
    history = Conversation().poll("running").call("sleep", SLEEP, "slept").poll("running")
    assert history.call("sleep", SLEEP, "slept").poll("running").history().looping_calls() == ()


def test_a_poll_that_progresses_goes_through() -> None:
    history = Conversation().poll("running: 10%").poll("running: 40%").history()
    assert not history.real_loop(POLL)
    # Progress once, then stuck: the last two results decide.
    assert Conversation().poll("10%").poll("40%").poll("40%").history().real_loop(POLL)


@pytest.mark.parametrize(
    "error",
    [
        "Error: connection refused",
        "**Error**: disk full",
        "[ERROR] timeout",  # also what a Messages tool_result with is_error: true becomes
        "error: exit status 1",
        "Traceback (most recent call last):\n  File ...",
        "Exit code: 1\nWall time: 0.1 seconds\nOutput:\nfailed",
        '{"output": "boom", "metadata": {"exit_code": 2, "duration_seconds": 0.1}}',
        '{"error": "not found"}',
        '{"success": false, "message": "busy"}',
        # opencode sends a failed tool's message alone (captured from its read tool).
        "Offset 10 is out of range for this file (2 lines)",
        "File not found: /tmp/project/calc.py",
        "ls: cannot access 'build': No such file or directory",
        # opencode's webfetch and skill tools without a network (captured with qwen2.5-coder-1.5b-instruct).
        "Transport error (GET https://opencode.ai/docs/faq)",
        "ripgrep execution failed",
        "Request failed with status code 503",
    ],
)
def test_a_retry_after_an_error_result_goes_through(error: str) -> None:
    assert error_result(error)
    history = Conversation().poll(error).poll(error).history()
    assert history.in_a_row(POLL) == 2
    assert not history.real_loop(POLL)
    assert history.looping_calls() == ()
    # One error among the two results is enough.
    assert not Conversation().poll("running").poll(error).history().real_loop(POLL)
    # A third failure the same way still goes through; a fourth makes the next identical call a real loop.
    assert not Conversation().poll(error).poll(error).poll(error).history().real_loop(POLL)
    assert Conversation().poll(error).poll(error).poll(error).poll(error).history().real_loop(POLL)


# What opencode's read tool answered, every time, to the 0.5B model's read(calc.py, offset=2000, limit=2000) of a
# 2-line file: the model looped on it until the client's 600 s timeout.
OUT_OF_RANGE = "Offset 2000 is out of range for this file (2 lines)"
READ: dict[str, object] = {"filePath": "/tmp/project/calc.py", "offset": 2000, "limit": 2000}
READ_CALL = CallKey.of("read", READ)


def _reads(conversation: Conversation, results: list[str]) -> Conversation:
    for result in results:
        conversation.call("read", READ, result)
    return conversation


def test_the_fifth_identical_call_after_the_same_error_four_times_is_a_real_loop() -> None:
    assert error_result(OUT_OF_RANGE)
    history = _reads(Conversation(), [OUT_OF_RANGE] * SAME_ERRORS).history()
    assert history.real_loop(READ_CALL)
    loop = history.loop(READ_CALL)
    assert loop is not None
    assert (loop.call, loop.same_results, loop.errors) == (5, 4, True)
    assert loop.reason() == "identical call 5 in a row after the same error result 4 times"
    assert history.looping_calls() == (READ_CALL,)
    (finding,) = history.findings([READ_CALL])
    assert "identical call 5 in a row" in finding
    assert "after the same error result 4 times" in finding
    # And on, for as long as the model keeps writing it (the guard off, or a client that sends it anyway).
    assert _reads(Conversation(), [OUT_OF_RANGE] * 9).history().loop(READ_CALL) == loop.model_copy(
        update={"call": 10, "same_results": 9}
    )


@pytest.mark.parametrize("failures", range(1, SAME_ERRORS))
def test_the_call_and_its_first_retries_after_the_same_error_go_through(failures: int) -> None:
    history = _reads(Conversation(), [OUT_OF_RANGE] * failures).history()
    assert history.in_a_row(READ_CALL) == failures
    assert not history.real_loop(READ_CALL)
    assert history.looping_calls() == ()
    assert not any("after" in finding for finding in history.findings([READ_CALL]))


def test_an_error_that_changed_starts_the_count_again() -> None:
    # Four errors, but the last differs from the three before it: a retry that got somewhere else.
    changed = [OUT_OF_RANGE] * 3 + ["Offset 2000 is out of range for this file (3 lines)"]
    assert not _reads(Conversation(), changed).history().real_loop(READ_CALL)
    # Whitespace around the error does not make it new.
    assert (
        _reads(Conversation(), [OUT_OF_RANGE, f"{OUT_OF_RANGE}\n", f" {OUT_OF_RANGE}", OUT_OF_RANGE])
        .history()
        .real_loop(READ_CALL)
    )
    # From the change on, it takes four identical errors again.
    assert not _reads(Conversation(), [*changed, *[OUT_OF_RANGE] * 3]).history().real_loop(READ_CALL)
    assert _reads(Conversation(), [*changed, *[OUT_OF_RANGE] * 4]).history().real_loop(READ_CALL)


def test_a_result_that_was_no_error_among_the_four_is_no_error_loop() -> None:
    # A result that is no error among the four breaks the run of identical errors.
    assert (
        not _reads(Conversation(), [OUT_OF_RANGE, "1: def add(a, b):", OUT_OF_RANGE, OUT_OF_RANGE])
        .history()
        .real_loop(READ_CALL)
    )


def test_a_changed_call_or_the_user_speaking_starts_the_count_again() -> None:
    other = {**READ, "offset": 1}
    conversation = _reads(Conversation(), [OUT_OF_RANGE] * 2).call("read", other, "1: def add(a, b):")
    # The other call breaks the row: after it, three identical errors are only three.
    assert not _reads(conversation, [OUT_OF_RANGE] * 3).history().real_loop(READ_CALL)
    # The user speaks after four identical errors: the count starts again from there.
    spoken = _reads(Conversation(), [OUT_OF_RANGE] * SAME_ERRORS).user("Try again, please.")
    assert spoken.history().turns == ()
    assert not _reads(spoken, [OUT_OF_RANGE] * 3).history().real_loop(READ_CALL)
    assert _reads(spoken, [OUT_OF_RANGE]).history().real_loop(READ_CALL)  # the fourth since the user spoke


def test_identical_results_that_are_no_error_still_loop_at_the_third_call() -> None:
    loop = Conversation().poll("running").poll("running").history().loop(POLL)
    assert loop is not None
    assert (loop.call, loop.same_results, loop.errors) == (3, 2, False)
    assert loop.reason() == "the third identical call in a row after two identical results"
    # Two identical results after errors: still the third call (the errors before them do not count).
    loop = Conversation().poll(OUT_OF_RANGE).poll("running").poll("running").history().loop(POLL)
    assert loop is not None
    assert (loop.call, loop.same_results, loop.errors) == (4, 2, False)


@pytest.mark.parametrize(
    "result",
    [
        "running",
        "Exit code: 0\nOutput:\nok",
        '{"error": null, "status": "running"}',
        "No errors found",
        "0 failed",
        "src/error.py: 3 functions",
        "No network errors, 0 failed requests",
        # Only the first line is read for failure words: output that mentions one further down is no error.
        "12 files\nsrc/cannot_fail.py: 3 tests, none invalid",
    ],
)
def test_results_that_are_no_error(result: str) -> None:
    assert not error_result(result)


def test_the_user_asking_again_right_after_a_tool_result_goes_through() -> None:
    history = Conversation().poll("running").poll("running").user("run it again").history()
    assert history.turns == ()
    assert not history.real_loop(POLL)
    assert history.findings([POLL]) == ()
    # From there it counts again: two more identical polls with identical results make a loop.
    assert Conversation().poll("x").poll("x").user("run it again").poll("x").poll("x").history().real_loop(POLL)


def test_a_system_reminder_beside_tool_results_is_not_the_user_speaking() -> None:
    reminder = "<system-reminder>\nThe task tools have not been used recently.\n</system-reminder>"
    history = Conversation().poll("running").user(reminder).poll("running").user(reminder).history()
    assert history.real_loop(POLL)
    # Text beside the reminder is the user speaking.
    assert not Conversation().poll("running").poll("running").user(reminder + "run it again").history().turns


def test_calls_in_between_or_a_reply_without_calls_break_the_row() -> None:
    read = CallKey.of("read", {"path": "a.txt"})
    history = Conversation().call("read", {"path": "a.txt"}, "a").call("edit", {"path": "a.txt"}, "ok")
    assert not history.call("read", {"path": "a.txt"}, "a").history().real_loop(read)
    text_reply = Conversation().poll("running")
    text_reply.messages.append(PromptMessage(role="assistant", content="Still running."))
    assert text_reply.poll("running").history().in_a_row(POLL) == 1


def test_a_call_without_its_result_is_no_loop() -> None:
    assert not Conversation().poll("running").call("check_status", STATUS, None).history().real_loop(POLL)


def test_parallel_calls_count_per_call() -> None:
    both = PromptToolCall(call_id="b", name="sleep", arguments=SLEEP)
    conversation = Conversation()
    for turn in range(2):
        poll = PromptToolCall(call_id=f"p{turn}", name="check_status", arguments=STATUS)
        conversation.messages += [
            PromptMessage(
                role="assistant", content="", tool_calls=(poll, both.model_copy(update={"call_id": f"s{turn}"}))
            ),
            PromptMessage(role="tool", content="running", tool_call_id=f"p{turn}"),
            PromptMessage(role="tool", content=f"slept {turn}", tool_call_id=f"s{turn}"),
        ]
    history = conversation.history()
    assert history.looping_calls() == (POLL,)
    assert not history.real_loop(CallKey.of("sleep", SLEEP))
