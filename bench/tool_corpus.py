"""The tool-call corpus of the `tool-calls-auto` section: prompts the project wrote, each with the tools it offers.

Every tool's schema has something a small model gets wrong under plain "auto": enums, integers with bounds, nested
objects, arrays, `additionalProperties: false`. `CORPUS` has 44 prompts that ask for a call; `PROSE` asks for
answers that need no tool (with the same tools offered), for the overhead on replies without calls; `FORCED` are
the required calls with at least four fields whose latency fast-forward should cut.
"""

from typing import Final

from pydantic import BaseModel, ConfigDict, JsonValue

JsonObject = dict[str, JsonValue]


def _tool(name: str, description: str, properties: JsonObject, required: list[str]) -> JsonObject:
    required_names: list[JsonValue] = list(required)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required_names,
                "additionalProperties": False,
            },
        },
    }


WEATHER: Final = _tool(
    "get_weather",
    "Current weather for a city.",
    {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    ["city", "unit"],
)
BOOK_FLIGHT: Final = _tool(
    "book_flight",
    "Book a flight.",
    {
        "origin": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code"},
        "destination": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code"},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
    },
    ["origin", "destination", "passengers", "cabin"],
)
CREATE_EVENT: Final = _tool(
    "create_event",
    "Create a calendar event.",
    {
        "title": {"type": "string"},
        "start": {
            "type": "object",
            "properties": {
                "date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
            },
            "required": ["date", "hour"],
            "additionalProperties": False,
        },
        "attendees": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "reminder_minutes": {"type": "integer", "enum": [5, 15, 30, 60]},
    },
    ["title", "start", "attendees", "reminder_minutes"],
)
SET_THERMOSTAT: Final = _tool(
    "set_thermostat",
    "Set a room's thermostat.",
    {
        "room": {"type": "string", "enum": ["kitchen", "bedroom", "office"]},
        "temperature": {"type": "integer", "minimum": 10, "maximum": 30},
        "mode": {"type": "string", "enum": ["heat", "cool", "auto"]},
    },
    ["room", "temperature", "mode"],
)
SEARCH_PRODUCTS: Final = _tool(
    "search_products",
    "Search a shop's catalogue.",
    {
        "query": {"type": "string"},
        "filters": {
            "type": "object",
            "properties": {
                "max_price": {"type": "integer", "minimum": 1},
                "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "blue", "green", "black"]}},
                "in_stock": {"type": "boolean"},
            },
            "required": ["max_price", "colors", "in_stock"],
            "additionalProperties": False,
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
    },
    ["query", "filters", "limit"],
)
WRITE_FILE: Final = _tool(
    "write_file",
    "Write a file.",
    {
        "path": {"type": "string"},
        "content": {"type": "string"},
        "mode": {"type": "string", "enum": ["overwrite", "append"]},
        "permissions": {"type": "integer", "enum": [420, 493]},
    },
    ["path", "content", "mode", "permissions"],
)
TRANSFER: Final = _tool(
    "transfer_money",
    "Transfer money between accounts.",
    {
        "from_account": {"type": "string", "pattern": "^ACC-\\d{4}$"},
        "to_account": {"type": "string", "pattern": "^ACC-\\d{4}$"},
        "amount_cents": {"type": "integer", "minimum": 1},
        "currency": {"type": "string", "enum": ["EUR", "USD", "JPY"]},
        "memo": {"type": "string", "maxLength": 40},
    },
    ["from_account", "to_account", "amount_cents", "currency"],
)
RUN_QUERY: Final = _tool(
    "run_query",
    "Run a read-only database query.",
    {
        "table": {"type": "string", "enum": ["users", "orders", "products"]},
        "columns": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
        "where": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "column": {"type": "string"},
                    "op": {"type": "string", "enum": ["=", "<", ">"]},
                    "value": {"type": "integer"},
                },
                "required": ["column", "op", "value"],
                "additionalProperties": False,
            },
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": 100},
    },
    ["table", "columns", "where", "limit"],
)
TOOLS: Final = (WEATHER, BOOK_FLIGHT, CREATE_EVENT, SET_THERMOSTAT, SEARCH_PRODUCTS, WRITE_FILE, TRANSFER, RUN_QUERY)


class ToolPrompt(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt: str
    tool: str
    """The tool the prompt is about (all of `TOOLS` are offered)."""


def _prompts(tool: str, *prompts: str) -> list[ToolPrompt]:
    return [ToolPrompt(prompt=prompt, tool=tool) for prompt in prompts]


CORPUS: Final = [
    *_prompts(
        "get_weather",
        "What's the weather in Paris in celsius?",
        "Weather in Tokyo for the next three days, fahrenheit please.",
        "Is it cold in Oslo right now? Use celsius.",
        "Give me a 10-day forecast for Lima.",
        "How hot is it in Cairo today in Fahrenheit?",
        "Weather for Berlin please.",
    ),
    *_prompts(
        "book_flight",
        "Book 2 economy seats from Paris CDG to New York JFK.",
        "I need a business class ticket from London Heathrow to Tokyo Haneda for one person.",
        "Book a flight from San Francisco to Boston for my family of four, cheapest cabin.",
        "Fly me first class from LAX to Sydney.",
        "Book twelve economy tickets from MAD to BCN.",
    ),
    *_prompts(
        "create_event",
        "Schedule 'Sprint review' on 2025-03-14 at 3pm with alice@example.com, remind me 15 minutes before.",
        "Create an event 'Dentist' tomorrow at 9 in the morning, just me, reminder one hour before.",
        "Put a lunch with Bob and Carol on 2025-06-01 at noon on my calendar, 10 minute reminder.",
        "Add 'Team offsite' on July 4th 2025 at 8am with the whole team, remind me half an hour before.",
        "Book a call with dana@example.com next Friday at 16:30, reminder 5 minutes.",
        "Create an event for my birthday party.",
    ),
    *_prompts(
        "set_thermostat",
        "Set the kitchen to 21 degrees on heat.",
        "Make the bedroom cooler, 18 degrees.",
        "Set the office thermostat to 35 degrees.",
        "Turn the living room heating to 22.",
        "Office: auto mode, twenty degrees.",
    ),
    *_prompts(
        "search_products",
        "Find red or blue running shoes under 80 dollars that are in stock, show 10.",
        "Search for black laptop bags, any price up to 200, only in-stock items, top 5.",
        "Show me green t-shirts cheaper than 25.",
        "I want a purple sofa under 1000, 3 results.",
        "Find me headphones.",
    ),
    *_prompts(
        "write_file",
        "Create the file hello.txt containing hello.",
        "Append the line 'done' to log.txt.",
        "Write a README.md that says 'My project', make it executable.",
        "Save notes.txt with the text 'buy milk', overwrite it.",
        'Write config.json containing {"debug": true}.',
    ),
    *_prompts(
        "transfer_money",
        "Send 25 euros from ACC-1234 to ACC-5678 for the concert tickets.",
        "Transfer $1,200.50 from account ACC-0001 to ACC-0002.",
        "Move 5000 yen from my account 1234 to 9876.",
        "Pay my landlord 800 EUR from ACC-4321 to ACC-8765, memo: rent for March and also the deposit refund.",
        "Transfer 10 bitcoin from ACC-1111 to ACC-2222.",
    ),
    *_prompts(
        "run_query",
        "List the names and emails of users older than 30, at most 20 rows.",
        "Show order ids and totals for orders above 100, limit 50.",
        "Which products have stock below 5? Give me name and stock.",
        "Get every column of the users table.",
        "Count the orders from last week.",
        "Top 1000 products by price.",
    ),
]
PROSE: Final = [
    "Explain in two sentences what a tool call is.",
    "Write a haiku about the sea.",
    "What is the capital of Italy? Answer in one word and then explain why it matters in one sentence.",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "List three colours of the rainbow.",
    "Why do programmers like Python? Two sentences.",
]
FORCED: Final = [prompt for prompt in CORPUS if prompt.tool in ("create_event", "run_query", "search_products")]
"""Required calls to tools with at least four fields (counting nested ones), for the fast-forward latency."""
