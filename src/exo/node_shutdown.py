"""How a serving node stops on SIGTERM or Ctrl-C (SIGINT), which the node handles itself instead of uvicorn.

The first signal stops the API from taking requests (new ones get 503 "the node is shutting down") and gives the
requests in flight SHUTDOWN_GRACE_SECONDS to finish; those still running then end with the dialect's error event
(model_unavailable, "the node is shutting down"), the runners are stopped and the process exits: 0 after SIGTERM
(a stop that was asked for and went as planned), 130 after Ctrl-C (the shell's convention). A second signal exits at
once: the runner processes are killed and the process exits with 128 + that signal's number, leaving out the
runners' prompt-snapshot writes and the goodbye to the cluster.
"""

import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Generator
from typing import TYPE_CHECKING

import anyio
import uvicorn

if TYPE_CHECKING:
    from exo.master.client import BusMasterClient

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 5
"""How long requests in flight may still run once a node is told to stop."""
SERVER_BACKSTOP_SECONDS = 3
"""Past the grace, how long uvicorn still waits for the connections to close after their streams were ended."""
SHUTDOWN_MESSAGE = "the node is shutting down"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signal_number: int | None) -> int:
    """The process's exit status after a clean stop asked for by `signal_number` (None: no signal stopped it)."""
    return 130 if signal_number == signal.SIGINT else 0


class NodeServer(uvicorn.Server):
    """uvicorn's server without its own signal handling: uvicorn would re-raise the signal after serving (with the
    default handler back, so the process dies before its runners are stopped). NodeShutdown handles them instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield


class NodeShutdown:
    """The node's stop signals: what the first starts (a graceful stop) and what a second does (exit now)."""

    def __init__(self, kill_runners: Callable[[], None]) -> None:
        self._kill_runners = kill_runners
        self.signal_number: int | None = None
        self.begun = anyio.Event()

    async def watch(self, signals: AsyncIterator[signal.Signals]) -> None:
        async for signal_number in signals:
            if self.signal_number is None:
                self.signal_number = signal_number
                logger.info(
                    "%s: stopping (requests in flight get %d s; a second signal exits at once)",
                    signal_number.name,
                    SHUTDOWN_GRACE_SECONDS,
                )
                self.begun.set()
            else:
                logger.warning("%s again: exiting now, killing the runners", signal_number.name)
                self._kill_runners()
                logging.shutdown()
                os._exit(128 + signal_number)

    async def stop_serving(self, server: uvicorn.Server, master: "BusMasterClient") -> None:
        """Once a stop begins: refuse new requests, stop the server, and after the grace end the streams left."""
        await self.begun.wait()
        master.stop_accepting(SHUTDOWN_MESSAGE)
        server.should_exit = True
        await anyio.sleep(SHUTDOWN_GRACE_SECONDS)
        master.end_streams(SHUTDOWN_MESSAGE)
