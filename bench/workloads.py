"""Deterministic request bodies: a long free-text prompt for decode speed and an opencode-shaped agent session."""

from itertools import cycle

from exo.api.types.openai_chat import ChatMessage, FunctionCall, FunctionDefinition, ToolCall, ToolDefinition

DECODE_PROMPT = (
    "Write a long, detailed technical essay on how hash tables work: hashing, collision handling with chaining "
    "and open addressing, load factors and resizing, and the complexity of every operation. Write at least 1000 "
    "words of plain prose; do not call any tool."
)

# Phrases an opencode-style system prompt is made of; cycled into numbered rules until the size is reached.
_SYSTEM_PHRASES = (
    "You are an interactive command line coding agent that helps users with software engineering tasks.",
    "Use the available tools to read, search and edit files; never guess file contents you have not read.",
    "Keep answers short and direct; explain non-trivial commands before you run them.",
    "Follow the conventions of the existing code: naming, formatting, imports and test layout.",
    "When a task needs several steps, plan them with the todo tool and mark each one done as you go.",
    "Never commit changes unless the user asks; never print secrets or credentials.",
    "Prefer editing existing files to creating new ones, and never create documentation unless asked.",
    "After a change, run the project's tests and linters and fix what they report before finishing.",
)

_TOOL_SPECS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("bash", "Run a shell command in a persistent session", {"command": "string", "timeout": "integer"}),
    ("read", "Read a file from the local filesystem", {"file_path": "string", "offset": "integer"}),
    ("write", "Write a file to the local filesystem", {"file_path": "string", "content": "string"}),
    ("edit", "Replace an exact string in a file", {"file_path": "string", "old_string": "string"}),
    ("glob", "Find files by glob pattern", {"pattern": "string", "path": "string"}),
    ("grep", "Search file contents with a regular expression", {"pattern": "string", "include": "string"}),
    ("list", "List the entries of a directory", {"path": "string", "ignore": "string"}),
    ("webfetch", "Fetch a URL and return its content as markdown", {"url": "string", "format": "string"}),
    ("todowrite", "Replace the session's todo list", {"todos": "string", "merge": "boolean"}),
    ("task", "Start a sub-agent for a self-contained task", {"description": "string", "prompt": "string"}),
)

_USER_TURNS = (
    "Look at the repository and tell me what the main entry point does.",
    "Now find where command-line arguments are parsed.",
    "Add a --verbose flag there and show me the change.",
    "Run the tests and summarize the result in one sentence.",
)

_TOOL_RESULT = "src/app/main.py\nsrc/app/cli.py\nsrc/app/server.py\ntests/test_cli.py\n"


def system_prompt(chars: int) -> str:
    """An opencode-like system prompt of exactly `chars` characters, the same on every run."""
    rules: list[str] = []
    size = 0
    for number, phrase in enumerate(cycle(_SYSTEM_PHRASES), start=1):
        rule = f"{number}. {phrase}\n"
        rules.append(rule)
        size += len(rule)
        if size >= chars:
            break
    return "".join(rules)[:chars]


def agent_tools(count: int) -> list[ToolDefinition]:
    """`count` (at most 10) opencode-shaped tool schemas; long descriptions, as real agents send."""
    tools: list[ToolDefinition] = []
    for name, summary, parameters in _TOOL_SPECS[:count]:
        description = f"{summary}. " + " ".join(
            f"The '{parameter}' parameter is a {kind}; pass it exactly as described."
            for parameter, kind in parameters.items()
        )
        properties = {
            parameter: {"type": kind, "description": f"The {parameter} to use"}
            for parameter, kind in parameters.items()
        }
        schema: dict[str, object] = {"type": "object", "properties": properties, "required": [next(iter(parameters))]}
        tools.append(ToolDefinition(function=FunctionDefinition(name=name, description=description, parameters=schema)))
    return tools


def decode_messages(tag: str) -> list[ChatMessage]:
    """The free-text request used for decode speed: long answer, no tool wanted.

    `tag` makes each run's prompt distinct, so no server answers a repeat from its prompt cache.
    """
    return [ChatMessage(role="user", content=f"({tag}) {DECODE_PROMPT}")]


def agent_opening(system_chars: int) -> list[ChatMessage]:
    """Turn 1 of the agent session: the system prompt and the first user request."""
    return [
        ChatMessage(role="system", content=system_prompt(system_chars)),
        ChatMessage(role="user", content=_USER_TURNS[0]),
    ]


def agent_follow_up(turn: int, reply_text: str, tool_call: tuple[str, str] | None) -> list[ChatMessage]:
    """Messages appended after turn `turn` (1-based): the assistant's reply, then a tool result or the next request.

    `tool_call` is (name, arguments) when the assistant called a tool: the session then answers it with a fixed
    tool result, as an agent would, and otherwise with the next user request.
    """
    if tool_call is not None:
        call_id = f"call_{turn}"
        name, arguments = tool_call
        call = ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))
        return [
            ChatMessage(role="assistant", content=reply_text or None, tool_calls=[call]),
            ChatMessage(role="tool", tool_call_id=call_id, content=_TOOL_RESULT),
        ]
    return [
        ChatMessage(role="assistant", content=reply_text),
        ChatMessage(role="user", content=_USER_TURNS[turn % len(_USER_TURNS)]),
    ]


# ---- prompt-lookup speculation: an opencode edit, a whole-file rewrite, and free text --------------------------------

_EDIT_FILE_PATH = "src/app/cli.py"
_EDIT_FILE = '''"""Command-line interface of the app: parse arguments, configure logging, run the server."""

import argparse
import logging
import sys

from app.server import Server, ServerConfig

logger = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line into a namespace."""
    parser = argparse.ArgumentParser(prog="app", description="Run the app server.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    parser.add_argument("--workers", type=int, default=4, help="worker threads")
    parser.add_argument("--log-level", default="info", help="logging level")
    return parser.parse_args(argv)


def configure_logging(level: str) -> None:
    """Send log records to stderr at the given level."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")


def build_config(arguments: argparse.Namespace) -> ServerConfig:
    """The server configuration the arguments describe."""
    return ServerConfig(host=arguments.host, port=arguments.port, workers=arguments.workers)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse, configure, serve until interrupted."""
    arguments = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(arguments.log_level)
    server = Server(build_config(arguments))
    logger.info("serving on %s:%d", arguments.host, arguments.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        logger.info("interrupted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
EDIT_FILE_LINES = len(_EDIT_FILE.splitlines())
_EDIT_REQUEST = (
    "In src/app/cli.py, add a --verbose flag to parse_args (store_true, help 'log more') right after the --log-level "
    "argument. Use the edit tool: oldString must be the whole parse_args function exactly as it is in the file."
)
EDIT_SYSTEM = (
    "You are opencode, an interactive CLI coding agent. Use the tools to read and change the user's files. When you "
    "edit, copy oldString exactly from the file as the read tool showed it, without the line-number prefixes."
)


def _numbered(text: str) -> str:
    """A file as opencode's read tool shows it: each line after its number and ': '."""
    return "\n".join(f"{number}: {line}" for number, line in enumerate(text.splitlines(), start=1))


_REWRITE_REQUEST = (
    "Add a --verbose flag (store_true, help 'log more') to parse_args right after --log-level. Reply with the whole "
    f"updated {_EDIT_FILE_PATH} in one python code block and nothing else."
)


def _read_file_history() -> list[ChatMessage]:
    """The agent was asked to show the file and read it with opencode's `read` tool."""
    read = ToolCall(
        id="call_read_1", function=FunctionCall(name="read", arguments=f'{{"filePath": "{_EDIT_FILE_PATH}"}}')
    )
    return [
        ChatMessage(role="system", content=EDIT_SYSTEM),
        ChatMessage(role="user", content=f"Show me {_EDIT_FILE_PATH}."),
        ChatMessage(role="assistant", content=None, tool_calls=[read]),
        ChatMessage(role="tool", tool_call_id="call_read_1", content=f"<file>\n{_numbered(_EDIT_FILE)}\n</file>"),
    ]


def rewrite_messages() -> list[ChatMessage]:
    """A whole-file rewrite (the reply format of editors that resend the file): after the same read, the user asks
    for the updated file as text. Almost all of the reply copies lines that are in the prompt."""
    return [*_read_file_history(), ChatMessage(role="user", content=_REWRITE_REQUEST)]


def edit_messages() -> list[ChatMessage]:
    """An opencode-shaped edit: the agent read a file, the user asks for a change only `edit` with the file's own text
    can make. The reply's oldString (and most of newString) would copy lines that are in the prompt."""
    return [*_read_file_history(), ChatMessage(role="user", content=_EDIT_REQUEST)]
