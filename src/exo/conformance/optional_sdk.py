"""Second readers from optional SDKs: `openai` and `anthropic` are development dependencies, so a runtime-only
install checks streams against the grammar rules alone. Each reader lives in its own module (the only one that
imports its SDK), loaded on first use.
"""

from collections.abc import Callable
from typing import TypeVar

from exo.conformance.contract import Violation
from exo.conformance.json_view import JsonMapping
from exo.conformance.protocol_check import ProtocolSummary

# Reads a protocol stream's decoded events as its SDK would; reports where that disagrees with the summary.
ProtocolReader = Callable[[list[JsonMapping], ProtocolSummary], list[Violation]]
Reader = TypeVar("Reader")


def optional_reader(sdk: str, load: Callable[[], Reader]) -> Reader | None:
    """`load()`'s reader, or None when importing it fails because the package `sdk` is not installed."""
    try:
        return load()
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] == sdk:
            return None
        raise
