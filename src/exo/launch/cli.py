"""`exo launch opencode|claude|codex [options] [-- CLIENT ARGS]`: run a coding agent against an exo node.

The launch finds the client, asks the node which models it serves, writes the client's configuration under
$EXO_HOME/launch/<client>/ (never the user's own files), then replaces itself with the client (`exec`), so the
client owns the terminal and its exit status is the command's.
"""

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, get_args

from exo.launch import claude_code, codex, opencode
from exo.launch.binary import CLIENTS_DIR_VARIABLE, find_client
from exo.launch.node import described_model, node_root
from exo.launch.plan import ClientInfo, ClientPlan, LaunchError, LaunchTarget, McpServer, write_files
from exo.mcp.node_client import DEFAULT_NODE_URL
from exo.models.paths import exo_home
from exo.shared.types.tasks import LoopGuardPolicy

Planner = Callable[[LaunchTarget, Path], ClientPlan]
CLIENTS: Final[dict[str, tuple[ClientInfo, Planner]]] = {
    opencode.CLIENT.name: (opencode.CLIENT, opencode.plan),
    claude_code.CLIENT.name: (claude_code.CLIENT, claude_code.plan),
    codex.CLIENT.name: (codex.CLIENT, lambda target, _folder: codex.plan(target)),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exo launch",
        description="Point a coding agent at an exo node and run it: its configuration is written under "
        "$EXO_HOME/launch/, never into your own files. Words after `--` go to the client.",
        epilog="Examples: exo launch opencode; exo launch claude -- -p 'Fix the failing test'; "
        "exo launch codex --model qwen2.5-coder-1.5b-instruct -- exec 'Add a README'",
    )
    parser.add_argument("client", choices=sorted(CLIENTS), help="the coding agent to run")
    parser.add_argument("--model", help="the served model to use (default: the one the node serves)")
    parser.add_argument("--url", default=DEFAULT_NODE_URL, help=f"the node's API address (default {DEFAULT_NODE_URL})")
    parser.add_argument(
        "--api-key", default=os.environ.get("EXO_API_KEY"), help="the node's API key (default $EXO_API_KEY)"
    )
    parser.add_argument(
        "--loop-guard",
        choices=get_args(LoopGuardPolicy),
        help="the agent-loop guard's policy for this client's requests, sent as the X-Exo-Loop-Guard header "
        "(default: the node's --loop-guard)",
    )
    parser.add_argument("--mcp", action="store_true", help="also give the agent exo's own tools (`exo mcp`)")
    parser.add_argument(
        "--client-bin",
        type=Path,
        help="the client's executable (default: found on PATH, then in $"
        f"{CLIENTS_DIR_VARIABLE}/<client>/node_modules/.bin, by default the build/ folder of exo's checkout)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="write the configuration and print the command instead of running it"
    )
    return parser


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The launch's own words and the client's (those after the first `--`)."""
    words = list(argv)
    if "--" in words:
        cut = words.index("--")
        return words[:cut], words[cut + 1 :]
    return words, []


def _shown(plan: ClientPlan, command: list[str], inherited: dict[str, str]) -> str:
    """The command as a shell line with the variables it sets (a key shown as `***`)."""
    secret = {"EXO_API_KEY", "ANTHROPIC_AUTH_TOKEN"}
    environment = plan.environment_for(inherited)
    variables = [
        f"{key}={'***' if key in secret and environment[key] else shlex.quote(environment[key])}"
        for key in [*plan.environment, *plan.appended_lines]
    ]
    unset = [f"-u {key}" for key in plan.removed_variables]
    return " ".join(["env", *unset, *variables, shlex.join(command)])


def _say(line: str) -> None:
    print(f"exo launch: {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> int:
    """Run `exo launch` with `argv` (the words after `launch`); returns only on an error or with --dry-run."""
    own, client_arguments = _split(argv)
    arguments = build_parser().parse_args(own)
    client, planner = CLIENTS[arguments.client]
    environment = dict(os.environ)
    try:
        binary = find_client(client, arguments.client_bin, environment)
        url = node_root(arguments.url)
        api_key: str | None = arguments.api_key or None
        card = described_model(url, api_key, arguments.model, _say)
        target = LaunchTarget(
            url=url,
            api_key=api_key,
            model=card.id,
            context_length=card.context_length,
            mcp=McpServer.for_node(url) if arguments.mcp else None,
            loop_guard=arguments.loop_guard,
        )
        plan = planner(target, exo_home() / "launch" / client.name)
        write_files(plan.files)
    except LaunchError as error:
        print(f"exo launch: {error}", file=sys.stderr)
        return 1
    command = plan.command(binary, client_arguments)
    if arguments.dry_run:
        print(_shown(plan, command, environment))
        return 0
    print(f"exo launch: {client.display_name} with {card.id} at {url}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    try:
        os.execve(command[0], command, plan.environment_for(environment))
    except OSError as error:
        print(f"exo launch: could not run {command[0]}: {error}", file=sys.stderr)
    return 1
