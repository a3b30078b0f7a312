"""The supervisor's reading side of a runner's pipe, on a thread of its own: every message waiting is read and handed
to the event loop in one call, so messages that pile up while the loop is busy cost one switch to it, not one each."""

import logging
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

import anyio.from_thread
from pydantic import ValidationError

from exo.shared.types.worker.runner_response import RunnerResponse, RunnerResponseAdapter

logger = logging.getLogger(__name__)


def read_responses(
    connection: Connection, process: BaseProcess, handle: Callable[[RunnerResponse], None], runner_name: str
) -> None:
    """Hand each message to `handle` on the event loop, in order, until the pipe closes or the process exits.

    A message that does not validate kills the runner (one that breaks the protocol cannot be trusted with the next
    task): the messages read before it are handled, none after."""
    while connection in wait([connection, process.sentinel]):
        messages: list[RunnerResponse] = []
        readable = True
        while readable and (not messages or connection.poll()):
            try:
                messages.append(RunnerResponseAdapter.validate_json(connection.recv_bytes()))
            except (EOFError, OSError):
                readable = False
            except ValidationError as error:
                logger.error("runner %s sent an unreadable message (%s); replacing it", runner_name, error)
                process.kill()
                readable = False
        if messages:
            anyio.from_thread.run_sync(_handle_all, handle, messages)
        if not readable:
            return


def _handle_all(handle: Callable[[RunnerResponse], None], messages: list[RunnerResponse]) -> None:
    for message in messages:
        handle(message)
