"""A tool extension for the example agent: deterministic weather over the line-JSON extension protocol.

Run by the agent as a subprocess (`--extension "python examples/extensions/weather_extension.py"`). It needs
nothing but the standard library, to show that an extension is just a program reading and writing JSON lines:
it registers `get_weather`, says `ready`, then answers each `tool_call` with a `tool_result`. The weather is made
up from a hash of the city name (temperature and sky), so every run gives the same answer for the same city.
"""

import hashlib
import json
import sys

TOOL_NAME = "get_weather"
SKIES = ("clear", "partly cloudy", "overcast", "light rain", "heavy rain", "thunderstorms", "snow", "fog")
REGISTRATION: dict[str, object] = {
    "type": "register_tool",
    "name": TOOL_NAME,
    "description": "Get the current weather for a city.",
    "schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
    },
}


def forecast(city: str) -> dict[str, object]:
    """The weather in `city`: temperature -10..35 °C and a sky, both from a BLAKE2 hash of the trimmed name."""
    digest = hashlib.blake2b(city.strip().casefold().encode(), digest_size=2).digest()
    return {"city": city, "temperature_c": digest[0] % 46 - 10, "sky": SKIES[digest[1] % len(SKIES)]}


def answer(call: dict[str, object]) -> dict[str, object]:
    """The `tool_result` for one `tool_call` (an error result when the call is not one this extension knows)."""
    arguments = call.get("args")
    city = arguments.get("city") if isinstance(arguments, dict) else None
    if call.get("name") != TOOL_NAME:
        content, is_error = f"unknown tool {call.get('name')!r}; this extension has {TOOL_NAME}", True
    elif not isinstance(city, str) or not city.strip():
        content, is_error = "'city' must be a non-empty string", True
    else:
        content, is_error = json.dumps(forecast(city)), False
    return {"type": "tool_result", "id": call.get("id"), "content": content, "is_error": is_error}


def send(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


def main() -> None:
    send(REGISTRATION)
    send({"type": "ready"})
    for line in sys.stdin:  # the agent closes stdin when it is done
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            print(f"weather_extension: ignoring a line that is not JSON: {line.strip()[:200]}", file=sys.stderr)
            continue
        if isinstance(message, dict) and message.get("type") == "tool_call":
            send(answer(message))


if __name__ == "__main__":
    main()
