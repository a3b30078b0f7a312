"""The agent's tool registry: every tool it may call, its definition for the API, and a `run` that never raises.

Tools come from three places and look the same to the model and to the loop:
  * typed Python functions, whose JSON schema comes from the signature (pydantic), so the schema the model sees and
    the validation the arguments get can never drift apart;
  * tools of MCP servers and of extension processes (`RemoteTool`), known only by the JSON schema they declared,
    which is checked once when they are registered and then validates every call's arguments.

Every failure a call can meet (unknown tool, bad JSON, invalid arguments, an error from the tool, a timeout) comes
back as the tool's result text, so the model can correct itself and the loop never crashes.
"""

import inspect
import json
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from jsonschema import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError, create_model
from pydantic_core import to_jsonable_python

logger = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT_SECONDS = 10.0
# OpenAI's rule for function names; a model cannot call a tool whose name it cannot write.
TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Tool(BaseModel):
    """One callable tool: the Python function, the model of its arguments, and what the model is told about it."""

    name: str
    description: str
    function: Callable[..., object]
    arguments: type[BaseModel]

    def definition(self) -> ChatCompletionFunctionToolParam:
        """The tool as the chat-completions API declares it."""
        return _definition(self.name, self.description, tidy_schema(self.arguments.model_json_schema()))


class ToolReply(BaseModel):
    """What a remote tool answered: its text, and whether the tool itself reported a failure."""

    model_config = ConfigDict(frozen=True)

    text: str
    is_error: bool = False


class RemoteTool(BaseModel):
    """A tool that runs elsewhere (an MCP server, an extension process); its declared JSON schema is all we know.

    `invoke` takes the validated arguments and returns the reply; it raises TimeoutError when the call outlived its
    time limit, and anything else it raises is reported to the model as the tool's failure.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    # As declared: the registry checks that it is an object schema before offering the tool.
    parameters: JsonValue
    # Where the tool came from, for log lines: "mcp server exo", "extension weather_extension".
    source: str
    invoke: Callable[[dict[str, Any]], ToolReply]


@dataclass(frozen=True)
class _CheckedTool:
    """A remote tool whose schema passed the registry's check, with the validator its arguments go through."""

    tool: RemoteTool
    parameters: dict[str, Any]
    validator: Validator

    def definition(self) -> ChatCompletionFunctionToolParam:
        return _definition(self.tool.name, self.tool.description, self.parameters)


def _definition(name: str, description: str, parameters: dict[str, Any]) -> ChatCompletionFunctionToolParam:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def tidy_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles and put `type` first, the way hand-written tool schemas read.

    Models see the schema as text in their prompt, so a schema shaped like the ones they were trained on helps.
    """
    tidy: dict[str, Any] = {"type": schema["type"]} if "type" in schema else {}
    for key, value in schema.items():
        if key in ("type", "title"):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            tidy[key] = {name: tidy_schema(child) for name, child in value.items()}  # pyright: ignore[reportUnknownArgumentType]
        elif isinstance(value, dict):
            tidy[key] = tidy_schema(value)  # pyright: ignore[reportUnknownArgumentType]
        elif isinstance(value, list):
            tidy[key] = [tidy_schema(item) if isinstance(item, dict) else item for item in value]  # pyright: ignore[reportUnknownArgumentType]
        else:
            tidy[key] = value
    return tidy


def tool_from_function(function: Callable[..., object]) -> Tool:
    """Derive a tool from a function: name, first docstring paragraph, and a pydantic model of its parameters.

    Describe a parameter with `Annotated[str, Field(description=...)]`; a default value makes it optional.
    """
    fields: dict[str, Any] = {}
    for parameter in inspect.signature(function, eval_str=True).parameters.values():
        if parameter.annotation is inspect.Parameter.empty:
            raise TypeError(f"{function.__name__}: parameter {parameter.name!r} needs a type hint")
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (parameter.annotation, default)
    description = (inspect.getdoc(function) or "").split("\n\n")[0].replace("\n", " ")
    arguments = create_model(f"{function.__name__}_arguments", **fields)
    return Tool(name=function.__name__, description=description, function=function, arguments=arguments)


def schema_problem(name: str, parameters: object) -> str | None:
    """Why a declared tool cannot be offered to a model (a bad name or schema), or None when it can."""
    if not TOOL_NAME_PATTERN.fullmatch(name):
        return f"the name must be 1-64 letters, digits, '_' or '-' (got {name!r})"
    if not isinstance(parameters, dict):
        return f"its schema must be a JSON object, not {type(parameters).__name__}"
    if parameters.get("type") != "object":  # pyright: ignore[reportUnknownMemberType]
        return 'its schema must describe an object ("type": "object"): arguments are named'
    try:
        validator_for(parameters).check_schema(parameters)
    except SchemaError as error:
        return f"its schema is not valid JSON Schema: {error.message}"
    return None


ToolFunction = TypeVar("ToolFunction", bound=Callable[..., object])
ToolErrorKind = Literal["unknown_tool", "invalid_arguments", "timeout", "tool_failed", "repeated_call"]


class ToolError(BaseModel):
    """What the model reads when a call could not run or failed: enough to fix the call and try again."""

    error: ToolErrorKind
    message: str


class ToolRun(BaseModel):
    """One executed call, kept so the app (and its tests) can see what the agent did."""

    name: str
    arguments: str
    result: str
    ok: bool


def call_with_timeout(function: Callable[[], object], timeout_seconds: float) -> object:
    """Run `function` in a daemon thread and wait at most `timeout_seconds` (raising TimeoutError after that).

    Python cannot kill a thread, so a tool that hangs keeps running in the background; a daemon thread at least
    does not keep the process alive at exit. Tools that can hang for good belong in a subprocess instead.
    """
    future: Future[object] = Future()

    def run() -> None:
        try:
            future.set_result(function())
        except Exception as error:  # handed to the caller through the future
            future.set_exception(error)

    threading.Thread(target=run, daemon=True, name="tool-call").start()
    return future.result(timeout=timeout_seconds)


class ToolRegistry:
    """The tools an agent may call, their definitions for the API, and a `run` that never raises."""

    def __init__(self, timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS) -> None:
        self.timeout_seconds = timeout_seconds
        self._tools: dict[str, Tool | _CheckedTool] = {}

    def register(self, function: ToolFunction) -> ToolFunction:
        """Add a function as a tool (usable as a decorator); it stays callable as before."""
        tool = tool_from_function(function)
        self._tools[tool.name] = tool
        return function

    def add_remote(self, tool: RemoteTool) -> bool:
        """Add a tool declared by an MCP server or an extension; a bad declaration is logged and skipped.

        Returns whether the tool was added. The first tool of a name wins: a later one would be ambiguous.
        """
        problem = schema_problem(tool.name, tool.parameters)
        if problem is None and tool.name in self._tools:
            problem = "a tool of that name is already registered"
        if problem is not None or not isinstance(tool.parameters, dict):
            logger.warning("skipping tool %r from %s: %s", tool.name, tool.source, problem)
            return False
        validator = validator_for(tool.parameters)(tool.parameters)
        self._tools[tool.name] = _CheckedTool(tool=tool, parameters=tool.parameters, validator=validator)
        return True

    def names(self) -> list[str]:
        """The registered tool names, in registration order."""
        return list(self._tools)

    def definitions(self) -> list[ChatCompletionFunctionToolParam]:
        """Every tool, declared for the `tools` field of a chat-completions request."""
        return [tool.definition() for tool in self._tools.values()]

    def run(self, name: str, arguments_json: str) -> ToolRun:
        """Validate the arguments, run the tool, and return its result (or the error) as the tool message text."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return failed_run(name, arguments_json, "unknown_tool", f"no tool named {name!r}; available: {known}")
        if isinstance(tool, _CheckedTool):
            return self._run_remote(tool, arguments_json)
        try:
            # An empty string is how some servers send "no arguments".
            arguments = tool.arguments.model_validate_json(arguments_json or "{}")
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in error.errors())
            return failed_run(
                name, arguments_json, "invalid_arguments", f"{problems} (received {_quoted(arguments_json)})"
            )
        try:
            result = call_with_timeout(lambda: tool.function(**dict(arguments)), self.timeout_seconds)
        except TimeoutError:
            return failed_run(name, arguments_json, "timeout", f"{name} took longer than {self.timeout_seconds:g}s")
        except Exception as error:  # any tool failure is the model's to see, not the loop's to crash on
            return failed_run(name, arguments_json, "tool_failed", f"{type(error).__name__}: {error}")
        return ToolRun(name=name, arguments=arguments_json, result=json.dumps(to_jsonable_python(result)), ok=True)

    def _run_remote(self, checked: _CheckedTool, arguments_json: str) -> ToolRun:
        name = checked.tool.name
        try:
            arguments: object = json.loads(arguments_json or "{}")
        except json.JSONDecodeError as error:
            return failed_run(
                name, arguments_json, "invalid_arguments", f"Invalid JSON: {error} ({_quoted(arguments_json)})"
            )
        if not isinstance(arguments, dict):
            return failed_run(name, arguments_json, "invalid_arguments", "the arguments must be a JSON object")
        problems = [
            f"{'.'.join(map(str, error.absolute_path)) or 'arguments'}: {error.message}"
            for error in checked.validator.iter_errors(arguments)
        ]
        if problems:
            message = f"{'; '.join(problems)} (received {_quoted(arguments_json)})"
            return failed_run(name, arguments_json, "invalid_arguments", message)
        try:
            reply = checked.tool.invoke(dict(arguments))  # pyright: ignore[reportUnknownArgumentType]
        except TimeoutError as error:
            return failed_run(name, arguments_json, "timeout", str(error) or f"{name} timed out")
        except Exception as error:  # a dead extension or a lost connection is the model's to see too
            return failed_run(name, arguments_json, "tool_failed", f"{type(error).__name__}: {error}")
        if reply.is_error:
            return failed_run(name, arguments_json, "tool_failed", reply.text)
        return ToolRun(name=name, arguments=arguments_json, result=reply.text, ok=True)


def _quoted(arguments_json: str) -> str:
    return repr(arguments_json if len(arguments_json) <= 200 else arguments_json[:200] + "…")


def failed_run(name: str, arguments_json: str, kind: ToolErrorKind, message: str) -> ToolRun:
    """A call that failed or was not run: the error the model reads instead of a result."""
    result = ToolError(error=kind, message=message).model_dump_json()
    return ToolRun(name=name, arguments=arguments_json, result=result, ok=False)
