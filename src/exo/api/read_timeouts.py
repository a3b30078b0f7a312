"""How long a client may take to send its request: slow or stalled clients cannot hold sockets forever.

uvicorn closes an idle keep-alive connection, but a client that sends part of a request (headers a byte at a time,
or a body that stops) holds its socket, its buffers and, for a body, a request task for as long as it likes. This
HTTP protocol adds the two read timeouts servers such as nginx have:

- the request line and headers must arrive within `header_seconds` of the connection waiting for them (a new
  connection, or one whose previous response is done);
- a body may pause at most `body_seconds` between two reads (a large upload on a slow link is fine; one that stops
  is not). Time during which exo itself is not reading (flow control while the app is busy) does not count.

Either timeout closes the connection; a body cut off that way reaches the app as a client disconnect.
"""

import asyncio
import logging
from typing import Literal

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_SECONDS = 30.0
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0

_Phase = Literal["headers", "body"]


def read_timeout_protocol(header_seconds: float, body_seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with these read timeouts (pass it as `uvicorn.Config(http=...)`)."""

    class ReadTimeoutProtocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _phase: _Phase | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._watch(received=False)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch(received=True)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch(received=False)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            super().connection_lost(exc)

        def _watch(self, *, received: bool) -> None:
            """Time what the client owes us now: its headers (one deadline for all of them) or its next body bytes."""
            if self.transport.is_closing():
                self._stop_timer()
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                if self._phase != "headers":
                    self._start_timer("headers", header_seconds)
            elif state is h11.SEND_BODY:
                if self._phase != "body" or received:
                    self._start_timer("body", body_seconds)
            else:
                self._stop_timer()

        def _start_timer(self, phase: _Phase, seconds: float) -> None:
            self._stop_timer()
            self._phase = phase
            self._timer = self.loop.call_later(seconds, self._expired, phase, seconds)

        def _stop_timer(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._phase = None, None

        def _expired(self, phase: _Phase, seconds: float) -> None:
            self._timer, self._phase = None, None
            if self.transport.is_closing():
                return
            if phase == "body" and self.flow.read_paused:
                self._start_timer(phase, seconds)  # exo is not reading: the client cannot be late
                return
            late = "its headers were not complete within" if phase == "headers" else "its body stalled for"
            logger.info("closing the connection from %s: %s %g s", _peer(self.client), late, seconds)
            self.transport.close()

    return ReadTimeoutProtocol


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
