"""Chunks → Ollama's answer: NDJSON lines as the model writes, or the whole answer; the same fold either way.

Text and thinking stream as they come. A tool call goes out whole, arguments decoded to an object, once its last
argument fragment is in (Ollama streams calls this way: its clients read `arguments` as an object and never join
fragments). The final line says `done: true` with Ollama's counts and durations (nanoseconds). An error mid-stream
is one `{"error": "…"}` line, which the `ollama` clients raise as a ResponseError.
"""

import json
import logging
import time
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel

from exo.api.errors import task_error
from exo.api.types.ollama import (
    OllamaAnswerMessage,
    OllamaCall,
    OllamaCallFunction,
    OllamaChatAnswer,
    OllamaChatFinal,
    OllamaError,
    OllamaGenerateAnswer,
    OllamaGenerateFinal,
    OllamaTimings,
)
from exo.shared.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    PrefillProgressChunk,
    ReasoningChunk,
    TokenChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
)

logger = logging.getLogger(__name__)

AnswerKind = Literal["chat", "generate"]
NDJSON_MEDIA_TYPE = "application/x-ndjson"


def created_at() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _arguments(text: str, name: str) -> dict[str, object]:
    """A call's arguments as the object Ollama's clients expect; a model that broke its JSON leaves `{}`."""
    try:
        decoded: object = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        decoded = None
    if isinstance(decoded, dict):
        return decoded  # pyright: ignore[reportUnknownVariableType]
    logger.warning("tool call %s has arguments that are not a JSON object; sending {}", name)
    return {}


class OllamaAnswer:
    """One answer of /api/chat or /api/generate, built a chunk at a time; each chunk yields the lines to send."""

    def __init__(self, model: str, kind: AnswerKind) -> None:
        self._model = model
        self._kind: AnswerKind = kind
        self._started = time.monotonic_ns()
        self._first_output: int | None = None
        self._content: list[str] = []
        self._thinking: list[str] = []
        self._calls: list[OllamaCall] = []
        # The call being written: its id, name and argument fragments so far.
        self._open_call: tuple[str, str, list[str]] | None = None
        self._timings: OllamaTimings | None = None

    def _line(self, content: str = "", thinking: str | None = None, calls: list[OllamaCall] | None = None) -> BaseModel:
        if self._kind == "generate":
            return OllamaGenerateAnswer(
                model=self._model, created_at=created_at(), response=content, thinking=thinking, done=False
            )
        message = OllamaAnswerMessage(content=content, thinking=thinking, tool_calls=calls)
        return OllamaChatAnswer(model=self._model, created_at=created_at(), message=message, done=False)

    def idle_line(self) -> BaseModel:
        """An empty line of the answer: sent while the prompt is read, so clients see the connection live."""
        return self._line()

    def _close_call(self) -> list[BaseModel]:
        if self._open_call is None:
            return []
        call_id, name, fragments = self._open_call
        self._open_call = None
        function = OllamaCallFunction(index=len(self._calls), name=name, arguments=_arguments("".join(fragments), name))
        call = OllamaCall(id=call_id, function=function)
        self._calls.append(call)
        return [self._line(calls=[call])]

    def _output_started(self) -> None:
        if self._first_output is None:
            self._first_output = time.monotonic_ns()

    def encode(self, chunk: Chunk) -> list[BaseModel]:
        """The lines `chunk` adds to the stream (an ErrorChunk is the error line)."""
        match chunk:
            case TokenChunk(text=text) | ReasoningChunk(text=text) if not text:
                return []
            case TokenChunk(text=text):
                self._output_started()
                self._content.append(text)
                return [*self._close_call(), self._line(content=text)]
            case ReasoningChunk(text=text):
                self._output_started()
                self._thinking.append(text)
                return [*self._close_call(), self._line(thinking=text)]
            case ToolCallChunk(call_id=call_id, name=name):
                self._output_started()
                closed = self._close_call()
                self._open_call = (call_id, name, [])
                return closed
            case ToolCallArgumentsChunk(fragment=fragment):
                if self._open_call is not None:
                    self._open_call[2].append(fragment)
                return []
            case FinishChunk():
                closed = self._close_call()
                self._timings = self._finish(chunk)
                return [*closed, self._final(whole=False)]
            case ErrorChunk():
                return [OllamaError(error=task_error(chunk).body.error.message)]
            case PrefillProgressChunk():
                return []

    def _finish(self, chunk: FinishChunk) -> OllamaTimings:
        now = time.monotonic_ns()
        first = self._first_output if self._first_output is not None else now
        usage = chunk.usage
        return OllamaTimings(
            done_reason="length" if chunk.finish_reason == "length" else "stop",
            total_duration=now - self._started,
            prompt_eval_count=usage.prompt_tokens,
            prompt_eval_duration=first - self._started,
            eval_count=usage.completion_tokens,
            eval_duration=now - first,
            exo_loop_warnings=list(chunk.loop_warnings) or None,
        )

    def _final(self, *, whole: bool) -> BaseModel:
        """The `done` line: empty when streamed (the text already went out), the whole answer otherwise."""
        assert self._timings is not None
        timings = self._timings.model_dump()
        content = "".join(self._content) if whole else ""
        thinking = ("".join(self._thinking) or None) if whole else None
        if self._kind == "generate":
            return OllamaGenerateFinal(
                model=self._model, created_at=created_at(), response=content, thinking=thinking, done=True, **timings
            )
        calls = (self._calls or None) if whole else None
        message = OllamaAnswerMessage(content=content, thinking=thinking, tool_calls=calls)
        return OllamaChatFinal(model=self._model, created_at=created_at(), message=message, done=True, **timings)

    def whole(self) -> BaseModel:
        """The non-streaming answer, once the final chunk is in."""
        return self._final(whole=True)


def ndjson_line(line: BaseModel) -> str:
    return line.model_dump_json(exclude_none=True) + "\n"


class NdjsonWriter:
    """An Ollama answer as an AnswerWriter: no opening or closing, one JSON object a line."""

    media_type = NDJSON_MEDIA_TYPE

    def __init__(self, answer: OllamaAnswer) -> None:
        self._answer = answer

    def opening(self) -> list[str]:
        return []

    def encode(self, chunk: Chunk) -> list[str]:
        return [ndjson_line(line) for line in self._answer.encode(chunk)]

    def closing(self) -> list[str]:
        return []

    def keep_alive(self, _where: str) -> list[str]:
        # NDJSON has no comments: an empty line of the answer keeps the connection alive for every client.
        return [ndjson_line(self._answer.idle_line())]

    def whole(self) -> BaseModel:
        return self._answer.whole()
