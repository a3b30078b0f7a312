"""What a grammar enforces: built by the engine from the task's tool policy and the model's tool format."""

from enum import StrEnum
from typing import Final

from exo.shared.types.api import JsonObject
from exo.shared.types.common import FrozenModel
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.names import ToolFormatName

ANY_ARGUMENTS: Final[JsonObject] = {"type": "object"}
"""The parameters of a tool whose schema the grammar leaves to validation: any arguments object."""


class UnsupportedConstraintError(ValueError):
    """The request asks for enforcement the grammar cannot give (a schema llguidance rejects, a keyword a format
    cannot express under `strict`)."""


class ReplyShape(StrEnum):
    """What the reply may be: the one name of a request's tool mode on the grammar's side (grammar/policy.py reads it
    from `tool_choice` and `response_format`; every format writes its grammar for it)."""

    CALLS = "calls"
    """One or more calls (one when not parallel: always so for a named tool_choice, whose single tool is the only
    one given), nothing else: `tool_choice` "required" or a named function."""
    TEXT_OR_CALLS = "text_or_calls"
    """Free text, or calls; text never carries a call past the grammar (an opened call must name a given tool and
    match its schema): the lazy grammar of `tool_choice: "auto"`."""
    TEXT_ONLY = "text_only"
    """Free text that never opens a call in the model's format: `tool_choice: "none"`."""
    ANSWER_OR_CALLS = "answer_or_calls"
    """The JSON answer of `response_format` (rule `answer`), or calls in its place."""


class ReasoningMarkers(FrozenModel):
    """A reasoning block the model may write before its reply (Qwen3 `<think>…</think>`); its text is free."""

    start: str
    end: str
    opened_in_prompt: bool = False
    """True when the chat template already wrote `start` at the end of the prompt: the reply begins inside it."""


class ToolConstraintSpec(FrozenModel):
    """Everything a tool-call grammar depends on."""

    tool_format: ToolFormatName
    tools: tuple[ToolSpec, ...]
    """The tools that may be called, already narrowed by a named choice or `allowed_tools` (empty for TEXT_ONLY)."""
    shape: ReplyShape
    parallel_tool_calls: bool
    reasoning: ReasoningMarkers | None = None
    """Set for reasoning models, so the constraint leaves room to think before the reply."""


class JsonAnswerSpec(FrozenModel):
    """Everything the structured-output grammar (`response_format` json_object / json_schema) depends on."""

    json_schema: JsonObject
    """The answer's schema (json_object: `{"type": "object"}`)."""
    every_keyword_enforced: bool = False
    """True (json_schema `strict: true`): a keyword llguidance cannot enforce is an error, not skipped."""
    reasoning: ReasoningMarkers | None = None
    tool_format: ToolFormatName = ToolFormatName.GENERIC
    """The model's tool-call format; only read when `tools` is not empty."""
    tools: tuple[ToolSpec, ...] = ()
    """Tools the model may call instead of answering (`tool_choice: "auto"`); empty: the answer is the reply."""
    tool_schemas_enforced: bool = False
    """Whether call arguments must match each tool's schema (a `strict` tool was offered) or be any object."""
    parallel_tool_calls: bool = True
