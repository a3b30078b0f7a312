"""Tools from an extension process: a subprocess that speaks one JSON object per line on stdin/stdout.

The protocol (any language can speak it; examples/extensions/weather_extension.py is a complete one):

    extension → agent   {"type": "register_tool", "name": ..., "description": ..., "schema": {JSON Schema}}
    extension → agent   {"type": "ready"}
    agent → extension   {"type": "tool_call", "id": "1", "name": ..., "args": {...}}
    extension → agent   {"type": "tool_result", "id": "1", "content": "...", "is_error": false}

The agent stays in charge: a tool with a bad name or schema is skipped with a log line, an extension that never
says `ready` is waited for only a grace period (its tools registered by then are used), a call gets a time limit,
lines that are not protocol messages are logged and ignored, and an extension that dies fails its pending calls.
The extension's stderr is the agent's stderr, so its own logs show up.
"""

import json
import logging
import subprocess
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import suppress
from functools import partial
from itertools import count
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from examples.agent_tools.registry import RemoteTool, ToolReply

logger = logging.getLogger(__name__)

DEFAULT_READY_GRACE_SECONDS = 5.0
DEFAULT_CALL_TIMEOUT_SECONDS = 60.0


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class RegisterTool(_Message):
    type: Literal["register_tool"]
    name: str
    description: str = ""
    # Kept as any JSON so a malformed schema reaches the registry's check and its log line, not a parse error.
    tool_schema: JsonValue = Field(alias="schema")


class Ready(_Message):
    type: Literal["ready"]


class ToolResult(_Message):
    type: Literal["tool_result"]
    id: str
    content: JsonValue
    is_error: bool = False


class ToolCall(_Message):
    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    args: dict[str, JsonValue]


ExtensionMessage = Annotated[RegisterTool | Ready | ToolResult, Field(discriminator="type")]
_MESSAGE: TypeAdapter[ExtensionMessage] = TypeAdapter(ExtensionMessage)


class ExtensionExitedError(RuntimeError):
    """The extension process is gone; its tools cannot answer any more."""


class Extension:
    """One running extension process and the calls waiting for its answers."""

    def __init__(self, command: Sequence[str], *, call_timeout_seconds: float = DEFAULT_CALL_TIMEOUT_SECONDS) -> None:
        self.name = Path(command[-1]).stem
        self.call_timeout_seconds = call_timeout_seconds
        self._process = subprocess.Popen(
            list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8", bufsize=1
        )
        self._registered: list[RegisterTool] = []
        self._ready = threading.Event()
        self._accepting_tools = True
        self._pending: dict[str, Future[ToolReply]] = {}
        # Set once its stdout has ended: no answer can come any more.
        self._gone = False
        self._lock = threading.Lock()
        # Writing may block on a full pipe; it must never hold the lock the reader needs to deliver results.
        self._write_lock = threading.Lock()
        self._call_ids = count(1)
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"extension-{self.name}")
        self._reader.start()

    def tools(self, ready_grace_seconds: float = DEFAULT_READY_GRACE_SECONDS) -> list[RemoteTool]:
        """Wait for `ready` (at most the grace period) and return the tools registered by then."""
        if not self._ready.wait(ready_grace_seconds):
            logger.warning(
                "extension %s sent no 'ready' within %gs; going on with the %d tools it registered",
                self.name,
                ready_grace_seconds,
                len(self._registered),
            )
        with self._lock:
            self._accepting_tools = False
            registered = list(self._registered)
        return [
            RemoteTool(
                name=declared.name,
                description=declared.description,
                parameters=declared.tool_schema,
                source=f"extension {self.name}",
                invoke=partial(self.call, declared.name),
            )
            for declared in registered
        ]

    def call(self, tool: str, arguments: dict[str, Any]) -> ToolReply:
        """Send one call and wait for its result; TimeoutError after the call timeout."""
        call_id = str(next(self._call_ids))
        answer: Future[ToolReply] = Future()
        with self._lock:
            if self._gone:
                raise ExtensionExitedError(self._exit_message())
            self._pending[call_id] = answer
        try:
            self._send(ToolCall(id=call_id, name=tool, args=arguments))
            return answer.result(timeout=self.call_timeout_seconds)
        except TimeoutError:
            raise TimeoutError(
                f"{tool} (extension {self.name}) did not answer within {self.call_timeout_seconds:g}s"
            ) from None
        finally:
            with self._lock:
                self._pending.pop(call_id, None)

    def close(self) -> None:
        """Close the extension's stdin (its signal to exit), then make sure it is gone."""
        if self._process.stdin is not None:
            with suppress(BrokenPipeError):  # closing flushes, and a dead extension reads nothing
                self._process.stdin.close()
        try:
            self._process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=2)

    def _send(self, message: ToolCall) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            with self._write_lock:
                stdin.write(message.model_dump_json() + "\n")
                stdin.flush()
        except (BrokenPipeError, ValueError) as error:  # ValueError: stdin already closed
            raise ExtensionExitedError(self._exit_message()) from error

    def _read(self) -> None:
        stdout = self._process.stdout
        assert stdout is not None
        for line in stdout:
            if line.strip():
                self._handle(line)
        self._process.wait()
        with self._lock:
            self._gone = True
            pending = list(self._pending.values())
            self._pending.clear()
        for answer in pending:
            answer.set_exception(ExtensionExitedError(self._exit_message()))
        self._ready.set()  # a dead extension sends no `ready`: nobody should wait out the grace period for it

    def _handle(self, line: str) -> None:
        try:
            message = _MESSAGE.validate_json(line)
        except ValidationError as error:
            logger.warning(
                "extension %s: ignoring a line that is not a protocol message (%s): %.200s",
                self.name,
                error.errors()[0]["msg"],
                line.strip(),
            )
            return
        match message:
            case RegisterTool():
                with self._lock:
                    accepted = self._accepting_tools
                    if accepted:
                        self._registered.append(message)
                if not accepted:
                    logger.warning("extension %s registered %r after start-up; ignored", self.name, message.name)
            case Ready():
                # Closed here, in the order the lines arrive: a tool registered after `ready` is refused however
                # soon it follows, not only once the agent has woken up to read the tools.
                with self._lock:
                    self._accepting_tools = False
                self._ready.set()
            case ToolResult():
                with self._lock:
                    answer = self._pending.pop(message.id, None)
                if answer is None:
                    logger.warning("extension %s answered unknown or expired call %r", self.name, message.id)
                    return
                text = message.content if isinstance(message.content, str) else json.dumps(message.content)
                answer.set_result(ToolReply(text=text, is_error=message.is_error))

    def _exit_message(self) -> str:
        code = self._process.poll()
        state = "is shutting down" if code is None else f"exited with code {code}"
        return f"extension {self.name} {state}"
