"""The MCP's side of POST /v1/chat/completions: the body exo_run_model sends, and the part of the answer it reads.

The server's models (exo.api.types.openai_chat) live in the API, a layer above this one; as any client of the
API, the tools declare what they send and read, and ignore the answer's other fields."""

from typing import Literal

from pydantic import BaseModel

from exo.shared.types.common import FinishReason


class UserMessage(BaseModel):
    role: Literal["user"] = "user"
    content: str


class ChatRequest(BaseModel):
    model: str
    messages: list[UserMessage]
    stream: Literal[False] = False
    max_tokens: int
    temperature: float | None = None


class ResponseFunctionCall(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class AnswerMessage(BaseModel):
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None


class AnswerChoice(BaseModel):
    message: AnswerMessage
    finish_reason: FinishReason


class AnswerUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class ChatAnswer(BaseModel):
    model: str
    choices: list[AnswerChoice]
    usage: AnswerUsage
