"""The failures a tool reports to the agent as an error result (never as a crashed server)."""

from pydantic import BaseModel


class ToolFailedError(Exception):
    """A failure the agent should read: `message` says what is wrong and what to do about it.

    `partial` is what the tool could still find out (exo_status says `running: false` when exo is down); it goes
    with the error as its structured content.
    """

    def __init__(self, message: str, partial: BaseModel | None = None) -> None:
        super().__init__(message)
        self.partial = partial
