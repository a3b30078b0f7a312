"""What a client's launch is made of: the node and model it is pointed at, and what running it takes."""

import hashlib
import os
import sys
from pathlib import Path
from typing import Final

from pydantic import Field

from exo.shared.types.common import FrozenModel
from exo.shared.types.tasks import LoopGuardPolicy

# The variable exo's own commands read the API key from; launched clients (and `exo mcp` under them) get it there,
# so no key is ever written into a configuration file.
API_KEY_VARIABLE: Final = "EXO_API_KEY"
# What a client calls exo: its provider id, and its MCP server's name.
EXO_NAME: Final = "exo"


class LaunchError(Exception):
    """Something the user can act on stopped the launch; the message says what and how."""


class ClientInfo(FrozenModel):
    """A client as npm installs it, and the version exo's tests run."""

    name: str  # what `exo launch NAME` calls it
    display_name: str
    binary: str
    package: str
    tested_version: str
    # The folder under build/ that .ci/install-clients installs it in.
    folder: str

    def install_command(self) -> str:
        return f"npm install -g {self.package}@{self.tested_version}"


class McpServer(FrozenModel):
    """How a client starts `exo mcp` (stdio) for the node it is pointed at."""

    command: str
    arguments: tuple[str, ...]

    @classmethod
    def for_node(cls, url: str) -> "McpServer":
        """`exo mcp` run by this very Python, so it works whether exo came from a checkout, uv or pip."""
        return cls(command=sys.executable, arguments=("-m", "exo", "mcp", "--url", url))


class LaunchTarget(FrozenModel):
    """The node (its root URL, no /v1), its key, the model the client is to use and, with --mcp, exo's tools."""

    url: str
    api_key: str | None = None
    model: str
    context_length: int | None = None
    mcp: McpServer | None = None
    # With --loop-guard: the policy the client asks for in every request's X-Exo-Loop-Guard header.
    loop_guard: LoopGuardPolicy | None = None

    @property
    def openai_url(self) -> str:
        """The OpenAI-compatible base URL (chat completions and responses live under it)."""
        return f"{self.url}/v1"


class ClientPlan(FrozenModel):
    """What running the client takes: files to write first, arguments before the user's, environment changes."""

    files: dict[Path, str] = Field(default_factory=dict)
    leading_arguments: tuple[str, ...] = ()
    arguments_after_subcommand: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    environment: dict[str, str] = Field(default_factory=dict)
    # Variables of the user's environment that would point the client elsewhere.
    removed_variables: tuple[str, ...] = ()
    # Lines added to a variable that holds one setting a line (Claude Code's ANTHROPIC_CUSTOM_HEADERS), after the
    # user's own lines, so their settings stay.
    appended_lines: dict[str, str] = Field(default_factory=dict)

    def command(self, binary: Path, client_arguments: list[str]) -> list[str]:
        """The client's whole command line: its launch arguments, then the user's (with a subcommand's own flags
        right after the subcommand, where the client only accepts them)."""
        user = list(client_arguments)
        if user and user[0] in self.arguments_after_subcommand:
            # A flag the user gave already is not repeated: some clients refuse a flag given twice.
            added = [flag for flag in self.arguments_after_subcommand[user[0]] if flag not in user[1:]]
            user = [user[0], *added, *user[1:]]
        return [str(binary), *self.leading_arguments, *user]

    def environment_for(self, inherited: dict[str, str]) -> dict[str, str]:
        """The client's environment: the user's, less what points elsewhere, plus the launch's settings."""
        kept = {key: value for key, value in inherited.items() if key not in self.removed_variables}
        appended = {
            key: "\n".join(part for part in (inherited.get(key, "").rstrip("\n"), line) if part)
            for key, line in self.appended_lines.items()
        }
        return kept | self.environment | appended


def content_addressed(folder: Path, stem: str, suffix: str, content: str) -> Path:
    """A file name that changes with the content, so two launches against different models never overwrite the
    configuration a running client reads."""
    digest = hashlib.sha256(content.encode()).hexdigest()[:12]
    return folder / f"{stem}-{digest}{suffix}"


def write_files(files: dict[Path, str]) -> None:
    """Write each file whole (through a temporary name), private to the user: it may name their node."""
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(content)
        temporary.chmod(0o600)
        temporary.replace(path)
