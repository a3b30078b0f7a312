"""A complete tool loop against exo with the official openai SDK, streaming.

The model asks for a tool, this script runs the tool locally, sends the result back, and streams the final
answer. Start exo first (`uv run exo`), then:

    uv run python examples/tool_calling_example.py
    uv run python examples/tool_calling_example.py --prompt "Is it warmer in Oslo or in Rome?"

See docs/TOOL_CALLING.md for what exo supports.
"""

import argparse
import json
import os
import sys
from typing import Literal

from openai import OpenAI
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)
from pydantic import BaseModel, ValidationError

DEFAULT_BASE_URL = "http://localhost:52415/v1"
MAX_ROUNDS = 5


class WeatherArguments(BaseModel):
    """The arguments of `get_weather`, validated before the tool runs."""

    city: str
    unit: Literal["celsius", "fahrenheit"] = "celsius"


class Weather(BaseModel):
    city: str
    temperature: float
    unit: Literal["celsius", "fahrenheit"]
    conditions: str


WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": WeatherArguments.model_json_schema(),
    },
}

# Canned observations so the example runs offline; a real tool would call a weather service here.
_OBSERVATIONS = {"paris": (18.0, "light rain"), "rome": (24.0, "sunny"), "oslo": (9.0, "overcast")}


def get_weather(arguments: WeatherArguments) -> Weather:
    """The local tool the model calls."""
    celsius, conditions = _OBSERVATIONS.get(arguments.city.lower(), (15.0, "clear"))
    temperature = celsius if arguments.unit == "celsius" else celsius * 9 / 5 + 32
    return Weather(city=arguments.city, temperature=temperature, unit=arguments.unit, conditions=conditions)


def run_tool(name: str, arguments_json: str) -> str:
    """Run the named tool; errors go back to the model as the tool's result so it can correct itself."""
    if name != "get_weather":
        return json.dumps({"error": f"unknown tool {name!r}"})
    try:
        arguments = WeatherArguments.model_validate_json(arguments_json)
    except ValidationError as error:
        return json.dumps({"error": f"invalid arguments: {error}"})
    return get_weather(arguments).model_dump_json()


def stream_turn(client: OpenAI, model: str, messages: list[ChatCompletionMessageParam]) -> ChatCompletionMessage:
    """Stream one assistant turn, printing reasoning, text and tool calls as they arrive; return the message."""
    with client.chat.completions.stream(
        model=model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        stream_options={"include_usage": True},
    ) as stream:
        for event in stream:
            if event.type == "chunk" and event.chunk.choices:
                # exo sends reasoning as `delta.reasoning_content`, an extension the SDK keeps as an extra field.
                reasoning = (event.chunk.choices[0].delta.model_extra or {}).get("reasoning_content")
                if isinstance(reasoning, str):
                    print(reasoning, end="", flush=True, file=sys.stderr)
            elif event.type == "content.delta":
                print(event.delta, end="", flush=True)
            elif event.type == "tool_calls.function.arguments.done":
                print(f"\n→ {event.name}({event.arguments})", flush=True)
        completion = stream.get_final_completion()
    if completion.usage is not None:
        print(f"\n[{completion.usage.prompt_tokens} prompt + {completion.usage.completion_tokens} completion tokens]")
    return completion.choices[0].message


def tool_loop(client: OpenAI, model: str, prompt: str) -> None:
    """Ask, run every requested tool, send the results back, until the model answers in text."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_ROUNDS):
        message = stream_turn(client, model, messages)
        calls = [call for call in message.tool_calls or [] if call.type == "function"]
        if not calls:
            return
        tool_calls: list[ChatCompletionMessageFunctionToolCallParam] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in calls
        ]
        messages.append({"role": "assistant", "content": message.content, "tool_calls": tool_calls})
        for call in calls:
            result = run_tool(call.function.name, call.function.arguments)
            print(f"← {result}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    print(f"\nstopped after {MAX_ROUNDS} rounds of tool calls", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a streamed tool-calling loop against an exo node.")
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL, help=f"exo API address (default {DEFAULT_BASE_URL})")
    parser.add_argument("--model", help="model id (default: the first model in /v1/models)")
    parser.add_argument("--api-key", default=os.environ.get("EXO_API_KEY", "not-needed"), help="if exo has one")
    parser.add_argument("--prompt", default="What's the weather in Paris right now?", help="the user's question")
    arguments = parser.parse_args()
    client = OpenAI(base_url=arguments.base_url, api_key=arguments.api_key)
    model: str = arguments.model or client.models.list().data[0].id
    tool_loop(client, model, arguments.prompt)


if __name__ == "__main__":
    main()
