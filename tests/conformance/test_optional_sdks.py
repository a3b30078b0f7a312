"""The SDK second readers are optional: with `anthropic` or `openai` missing, the grammar checks still run and the
CLI says which reader it could not use. (test_runtime_install.py proves the same on a real install without them.)"""

import sys

import pytest

from exo.conformance.cli import missing_readers
from exo.conformance.messages_contract import anthropic_reader, check_messages_stream
from exo.conformance.optional_sdk import optional_reader
from exo.conformance.responses_contract import check_responses_stream, responses_reader

# A stream that opens with its last event: every checker must flag it, SDK or not.
_MESSAGES_FROM_THE_END = 'event: message_stop\ndata: {"type": "message_stop"}\n\n'
_RESPONSES_FROM_THE_END = 'event: response.completed\ndata: {"type": "response.completed"}\n\n'


def _without(monkeypatch: pytest.MonkeyPatch, sdk: str, reader_module: str) -> None:
    """Make `import sdk` fail as it does where the package is not installed, and forget the reader that used it."""
    monkeypatch.setitem(sys.modules, sdk, None)
    for name in [name for name in sys.modules if name.startswith(f"{sdk}.")]:  # submodules already imported
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, reader_module, raising=False)


def test_with_both_sdks_installed_both_readers_load_and_the_cli_notes_nothing() -> None:
    assert anthropic_reader() is not None
    assert responses_reader() is not None
    assert missing_readers() == []


def test_without_anthropic_the_messages_grammar_is_still_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "anthropic", "exo.conformance.anthropic_crosscheck")
    assert anthropic_reader() is None
    assert "messages:order" in {
        violation.rule for violation in check_messages_stream(_MESSAGES_FROM_THE_END).violations
    }
    assert missing_readers() == [
        "(anthropic is not installed: Messages streams were checked against the protocol's rules alone)"
    ]


def test_without_openai_the_responses_grammar_is_still_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "openai", "exo.conformance.responses_crosscheck")
    monkeypatch.delitem(sys.modules, "exo.conformance.openai_crosscheck", raising=False)
    assert responses_reader() is None
    rules = {violation.rule for violation in check_responses_stream(_RESPONSES_FROM_THE_END).violations}
    assert "responses:lifecycle" in rules
    assert len(missing_readers()) == 1
    assert missing_readers()[0].startswith("(openai-python is not installed")


def test_a_broken_reader_module_is_an_error_not_a_missing_sdk() -> None:
    def load() -> object:
        raise ModuleNotFoundError("No module named 'openai_helpers'", name="openai_helpers")

    with pytest.raises(ModuleNotFoundError):
        optional_reader("openai", load)
