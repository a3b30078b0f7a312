"""A tool-calling agent against exo with the official `openai` SDK: a copyable starting point for an app.

What it shows:
  * tools are plain typed Python functions; their JSON schema comes from the signature (pydantic), so the schema
    the model sees and the validation the arguments get can never drift apart;
  * tools are also discovered: from MCP servers named on the command line (exo's own `exo mcp` included) and from
    extension processes speaking a small line-JSON protocol (see examples/agent_tools/extension.py and the
    weather extension in examples/extensions/); their schemas are checked when they register;
  * the agent loop streams each answer, prints text as it arrives, and assembles tool calls from their deltas;
  * every failure a tool call can meet (unknown tool, bad JSON, invalid arguments, an exception, a timeout) goes
    back to the model as the tool's result, so the model can correct itself and the loop never crashes;
  * a per-tool timeout, a limit on the number of turns, and a guard against a model that repeats a call it has
    already made (small models do): the repeat is not run again, the model reads a note saying so, and the next
    turn is asked with `tool_choice: "none"` so it answers from the results it has.

Start exo, then run the example (with no --model it uses the first model exo serves):

    uv run exo
    uv run python examples/tool_calling_example.py --prompt "What is the weather in Paris and Tokyo?"
    uv run python examples/tool_calling_example.py --prompt "What is (2 + 3) * 7 - 2 ** 5?" --no-stream
    uv run python examples/tool_calling_example.py --tools get_time --prompt "What time is it in Tokyo?"

With discovered tools instead of the built-in ones: the weather extension, and exo's own MCP tools (cluster
status, memory, models) from `exo mcp` over stdio or from the node's `/mcp` endpoint:

    uv run python examples/tool_calling_example.py --tools --extension "python examples/extensions/weather_extension.py"
    uv run python examples/tool_calling_example.py --tools --mcp "uv run exo mcp" --prompt "Is exo up?"
    uv run python examples/tool_calling_example.py --tools --mcp http://127.0.0.1:52415/mcp --prompt "Is exo up?"

Offline, with the repository's tiny test model (trained on one prompt and only the get_weather tool; it answers
sensibly only after the made-up result it was trained on, so expect its final text to be odd):

    uv run exo --model tests/fixtures/models/tiny-qwen-tools
    uv run python examples/tool_calling_example.py --tools get_weather --prompt "What is the weather in Paris?"

The tools run locally and offline: the weather is made up (but the same for a city every time), the calculator
parses arithmetic with `ast` and never calls `eval`, and the clock reads the IANA time zone database.
"""

import argparse
import ast
import hashlib
import json
import logging
import math
import operator
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TextIO
from zoneinfo import ZoneInfo

from openai import OpenAI
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)
from pydantic import BaseModel, Field

# Run as a script, only examples/ is on the import path; the agent's modules import as `examples.agent_tools`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.agent_tools.discovery import discovered_tools, parse_header
from examples.agent_tools.extension import DEFAULT_CALL_TIMEOUT_SECONDS, DEFAULT_READY_GRACE_SECONDS
from examples.agent_tools.registry import DEFAULT_TOOL_TIMEOUT_SECONDS, ToolRegistry, ToolRun, failed_run

DEFAULT_BASE_URL = "http://localhost:52415/v1"
DEFAULT_PROMPT = "What is the weather in Paris?"
DEFAULT_MAX_TURNS = 6
REPEATED_CALL_NOTE = (
    "You already called {name} with these arguments and its result is above. Do not call it again: answer the "
    "user's question now."
)

# --------------------------------------------------------------------------------------------------- the tools


class Weather(BaseModel):
    city: str
    temperature: int
    condition: str


_CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "foggy", "snowy")


def get_weather(city: Annotated[str, Field(description="City name")]) -> Weather:
    """Get the current weather for a city.

    Made up, but the same for a city every time (a hash of its name), so the example runs offline.
    """
    digest = hashlib.sha256(city.strip().lower().encode()).digest()
    return Weather(city=city, temperature=digest[0] % 40 - 5, condition=_CONDITIONS[digest[1] % len(_CONDITIONS)])


class CalculationError(ValueError):
    """The expression is not plain arithmetic, or its result would be unreasonably large."""


_BINARY_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
MAX_EXPRESSION_LENGTH = 200
MAX_RESULT_BITS = 4096  # about 1,200 decimal digits: no expression can make the calculator spin or eat memory


def calculate(expression: Annotated[str, Field(description="Arithmetic, e.g. (2 + 3) * 4 ** 2 % 7")]) -> float:
    """Evaluate an arithmetic expression with numbers, + - * / ** %, parentheses and unary minus."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CalculationError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalculationError(f"not an arithmetic expression: {error.msg}") from None
    return _evaluate(tree.body)


def _evaluate(node: ast.expr) -> float:
    # Only the node types below are accepted: names, calls, attributes, subscripts and the rest never evaluate.
    match node:
        case ast.Constant(value=bool()):
            raise CalculationError("booleans are not numbers here")
        case ast.Constant(value=int() | float() as value):
            return value
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_evaluate(operand)
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY_OPERATORS:
            left_value, right_value = _evaluate(left), _evaluate(right)
            if isinstance(op, ast.Pow):
                _check_power(left_value, right_value)
            try:
                result: float = _BINARY_OPERATORS[type(op)](left_value, right_value)
            except (ZeroDivisionError, OverflowError) as error:
                raise CalculationError(str(error)) from None
            if isinstance(result, int) and result.bit_length() > MAX_RESULT_BITS:
                raise CalculationError("result too large")
            if isinstance(result, complex):  # a negative number to a fractional power
                raise CalculationError("result is not a real number")
            return result
        case _:
            raise CalculationError(f"{type(node).__name__} is not allowed; use numbers and + - * / ** % ( )")


def _check_power(base: float, exponent: float) -> None:
    # Estimate the size before computing: 9 ** 10 ** 6 would otherwise take seconds and megabytes.
    if abs(base) > 1 and exponent * math.log2(abs(base)) > MAX_RESULT_BITS:
        raise CalculationError("result too large")


class LocalTime(BaseModel):
    timezone: str
    time: str


def get_time(timezone: Annotated[str, Field(description="IANA time zone, e.g. Europe/Paris")]) -> LocalTime:
    """Get the current time in a timezone."""
    return LocalTime(timezone=timezone, time=datetime.now(ZoneInfo(timezone)).isoformat(timespec="seconds"))


EXAMPLE_TOOLS: tuple[Callable[..., object], ...] = (get_weather, calculate, get_time)


def example_registry(names: Iterable[str], timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS) -> ToolRegistry:
    """A registry holding the example tools with these names (small models do best with only the tools they need)."""
    registry = ToolRegistry(timeout_seconds)
    for function in EXAMPLE_TOOLS:
        if function.__name__ in names:
            registry.register(function)
    return registry


# ----------------------------------------------------------------------------------------------- the agent loop


ToolChoice = Literal["auto", "none"]


class ToolCallRequest(BaseModel):
    """A call the model asked for, assembled from its streamed pieces."""

    id: str = ""
    name: str = ""
    arguments: str = ""


class AssistantTurn(BaseModel):
    content: str
    tool_calls: list[ToolCallRequest]


class AgentResult(BaseModel):
    """The final answer (None when the turn limit ran out first) and every tool call made on the way."""

    answer: str | None
    tool_runs: list[ToolRun]


def stream_turn(
    client: OpenAI,
    model: str,
    messages: list[ChatCompletionMessageParam],
    tools: list[ChatCompletionFunctionToolParam],
    output: TextIO,
    *,
    tool_choice: ToolChoice = "auto",
) -> AssistantTurn:
    """Stream one assistant turn: print text as it arrives, and assemble tool calls from their deltas by index."""
    content: list[str] = []
    calls: dict[int, ToolCallRequest] = {}
    stream = client.chat.completions.create(
        model=model, messages=messages, tools=tools, tool_choice=tool_choice, stream=True
    )
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            # exo streams reasoning as `delta.reasoning_content`, an extension the SDK keeps as an extra field.
            reasoning = (delta.model_extra or {}).get("reasoning_content")
            if isinstance(reasoning, str):
                print(reasoning, end="", flush=True, file=sys.stderr)
            if delta.content:
                content.append(delta.content)
                print(delta.content, end="", flush=True, file=output)
            # The first delta of a call carries its id and name; the arguments arrive as string pieces after it.
            for piece in delta.tool_calls or []:
                call = calls.setdefault(piece.index, ToolCallRequest())
                call.id = piece.id or call.id
                if piece.function is not None:
                    call.name += piece.function.name or ""
                    call.arguments += piece.function.arguments or ""
    if content:
        print(file=output)
    return AssistantTurn(content="".join(content), tool_calls=[calls[index] for index in sorted(calls)])


def complete_turn(
    client: OpenAI,
    model: str,
    messages: list[ChatCompletionMessageParam],
    tools: list[ChatCompletionFunctionToolParam],
    output: TextIO,
    *,
    tool_choice: ToolChoice = "auto",
) -> AssistantTurn:
    """One assistant turn without streaming."""
    reply = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice=tool_choice)
    message = reply.choices[0].message
    if message.content:
        print(message.content, file=output)
    calls = [
        ToolCallRequest(id=call.id, name=call.function.name, arguments=call.function.arguments)
        for call in message.tool_calls or []
        if call.type == "function"
    ]
    return AssistantTurn(content=message.content or "", tool_calls=calls)


def run_agent(
    client: OpenAI,
    model: str,
    prompt: str,
    registry: ToolRegistry,
    *,
    stream: bool = True,
    max_turns: int = DEFAULT_MAX_TURNS,
    output: TextIO | None = None,
) -> AgentResult:
    """Ask, run every tool the model calls, send the results back, and repeat until it answers in text.

    Text and tool activity are printed to `output` (standard output by default) as they happen.
    """
    destination = output or sys.stdout
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    tool_runs: list[ToolRun] = []
    calls_made: set[tuple[str, str]] = set()
    tool_choice: ToolChoice = "auto"
    take_turn = stream_turn if stream else complete_turn
    for _ in range(max_turns):
        turn = take_turn(client, model, messages, registry.definitions(), destination, tool_choice=tool_choice)
        if not turn.tool_calls:
            return AgentResult(answer=turn.content, tool_runs=tool_runs)
        messages.append({"role": "assistant", "content": turn.content or None, "tool_calls": _as_params(turn)})
        tool_choice = "auto"
        for call in turn.tool_calls:
            print(f"→ {call.name}({call.arguments})", file=destination)
            key = (call.name, _canonical_arguments(call.arguments))
            if key in calls_made:
                run = failed_run(call.name, call.arguments, "repeated_call", REPEATED_CALL_NOTE.format(name=call.name))
                tool_choice = "none"  # the results are all there: the next turn must answer in text
            else:
                calls_made.add(key)
                run = registry.run(call.name, call.arguments)
            print(f"← {run.result}", file=destination)
            tool_runs.append(run)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run.result})
    return AgentResult(answer=None, tool_runs=tool_runs)


def _canonical_arguments(arguments: str) -> str:
    """The arguments with key order and spacing normalised, so `{"a":1}` and `{ "a": 1 }` are the same call."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except json.JSONDecodeError:
        return arguments


def _as_params(turn: AssistantTurn) -> Iterable[ChatCompletionMessageFunctionToolCallParam]:
    # Servers render past arguments into the prompt as JSON and refuse a history whose arguments are not JSON, so
    # a broken call goes back as `{}`; its tool result quotes what the model actually sent.
    return [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": _json_or_empty(call)}}
        for call in turn.tool_calls
    ]


def _json_or_empty(call: ToolCallRequest) -> str:
    try:
        json.loads(call.arguments)
    except json.JSONDecodeError:
        return "{}"
    return call.arguments


def build_parser() -> argparse.ArgumentParser:
    """The example's command line."""
    parser = argparse.ArgumentParser(description="A tool-calling agent against an exo node (openai SDK).")
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL, help=f"exo API address (default {DEFAULT_BASE_URL})")
    parser.add_argument("--model", help="model id (default: the first model in /v1/models)")
    parser.add_argument("--api-key", default="not-needed", help="only if your server wants one")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"the user's question (default {DEFAULT_PROMPT!r})")
    parser.add_argument("--no-stream", action="store_true", help="wait for whole answers instead of streaming")
    parser.add_argument("--max-turns", type=int, default=DEFAULT_MAX_TURNS, help="model turns before giving up")
    parser.add_argument("--tool-timeout", type=float, default=DEFAULT_TOOL_TIMEOUT_SECONDS, help="seconds per call")
    tool_names = [function.__name__ for function in EXAMPLE_TOOLS]
    parser.add_argument(
        "--tools", nargs="*", choices=tool_names, default=tool_names, help="the built-in tools to offer (none: --tools)"
    )
    parser.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="COMMAND_OR_URL",
        help="an MCP server to load tools from: a command run over stdio ('uv run exo mcp') or a URL (repeatable)",
    )
    parser.add_argument(
        "--mcp-header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a header for MCP servers reached by URL, e.g. 'Authorization: Bearer KEY' (repeatable)",
    )
    parser.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="COMMAND",
        help="an extension process speaking the line-JSON tool protocol (repeatable)",
    )
    parser.add_argument(
        "--ready-grace",
        type=float,
        default=DEFAULT_READY_GRACE_SECONDS,
        help=f"seconds to wait for an extension's 'ready' (default {DEFAULT_READY_GRACE_SECONDS:g})",
    )
    parser.add_argument(
        "--remote-tool-timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT_SECONDS,
        help=f"seconds per MCP or extension call (default {DEFAULT_CALL_TIMEOUT_SECONDS:g})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, load the tools, run the agent once, and return the exit status."""
    arguments = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    headers = dict(parse_header(header) for header in arguments.mcp_header)
    client = OpenAI(base_url=arguments.base_url, api_key=arguments.api_key)
    model: str = arguments.model or client.models.list().data[0].id
    with discovered_tools(
        example_registry(arguments.tools, arguments.tool_timeout),
        mcp_servers=arguments.mcp,
        mcp_headers=headers,
        extensions=arguments.extension,
        ready_grace_seconds=arguments.ready_grace,
        call_timeout_seconds=arguments.remote_tool_timeout,
    ) as registry:
        print(f"tools: {', '.join(registry.names()) or 'none'}", file=sys.stderr)
        result = run_agent(
            client, model, arguments.prompt, registry, stream=not arguments.no_stream, max_turns=arguments.max_turns
        )
    if result.answer is None:
        print(f"no answer after {arguments.max_turns} turns", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
