"""The cluster bus: this node's zenoh session, carrying typed messages only.

Zenoh calls back on its own threads. Every incoming payload is validated there against the pydantic type its key
expects and handed to the event loop; a payload that is not valid (malformed, foreign, from an incompatible
version, oversized) is logged and dropped, so nothing from the network can crash a node or reach its state
unchecked.
"""

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import zenoh
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, TypeAdapter, ValidationError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Chat requests are capped at 32 MiB by the API; nothing legitimate on the bus is larger than twice that.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A flood of bad messages logs one line per key per interval, with a count, instead of one line each.
DROP_LOG_INTERVAL_SECONDS = 10.0


class Bus:
    """Typed publish/subscribe, liveliness and queries over one zenoh session. Create with `await Bus.open(...)`."""

    def __init__(self, session: zenoh.Session, loop: asyncio.AbstractEventLoop) -> None:
        self.session = session
        self._loop = loop
        # Zenoh undeclares what it no longer references; these live as long as the bus.
        self._declarations: list[Any] = []
        self._senders: list[MemoryObjectSendStream[Any]] = []
        self._inboxes: dict[str, tuple[MemoryObjectSendStream[Any], TypeAdapter[Any]]] = {}
        """This node's own keys (`subscribe`'s `inbox`): what it publishes there is handed over directly."""
        self.dropped_messages = 0
        self._drops_since_log: dict[str, int] = {}
        self._last_drop_log: dict[str, float] = {}

    @classmethod
    async def open(cls, config: zenoh.Config) -> "Bus":
        """Open the session (it may wait briefly for scouting replies, so off the event loop)."""
        session = await anyio.to_thread.run_sync(zenoh.open, config)
        return cls(session, asyncio.get_running_loop())

    def publish(self, key: str, message: BaseModel) -> None:
        """Send `message` reliably and at once (no batching delay); a full queue waits rather than drops. On one of
        this node's inboxes it is handed to the subscriber as it is, in publishing order, without zenoh."""
        inbox = self._inboxes.get(key)
        if inbox is not None:
            sender, adapter = inbox
            self._hand_over_here(sender, adapter.validate_python(message))
            return
        self.session.put(
            key,
            message.model_dump_json().encode(),
            congestion_control=zenoh.CongestionControl.BLOCK,
            express=True,
        )

    def subscribe(self, key: str, adapter: TypeAdapter[T], *, inbox: bool = False) -> MemoryObjectReceiveStream[T]:
        """The valid messages published on `key` (a key expression), in arrival order. `inbox`: `key` is this node's
        own (no other node subscribes to it, as its task replies): a message this node publishes there skips zenoh,
        its encoding and its validation (a streamed token's chunk took about 30-90 us of CPU on that round trip,
        beside the decode it shares the cores with); other nodes' messages arrive through zenoh as before."""
        sender, receiver = anyio.create_memory_object_stream[T](max_buffer_size=math.inf)
        self._senders.append(sender)
        if inbox:
            self._inboxes[key] = (sender, adapter)

        def on_sample(sample: zenoh.Sample) -> None:
            message = self._validate(str(sample.key_expr), sample.payload.to_bytes(), adapter)
            if message is not None:
                self._hand_over(sender, message)

        self._declarations.append(self.session.declare_subscriber(key, on_sample))
        return receiver

    def declare_token(self, key: str) -> None:
        """Announce this session under `key` until the session closes (or its lease runs out, if it dies)."""
        self._declarations.append(self.session.liveliness().declare_token(key))

    def watch_liveliness(self, key: str) -> MemoryObjectReceiveStream[tuple[bool, str]]:
        """(alive, token key) for every token under `key`: the ones present now, then each arrival and departure."""
        sender, receiver = anyio.create_memory_object_stream[tuple[bool, str]](max_buffer_size=math.inf)
        self._senders.append(sender)

        def on_sample(sample: zenoh.Sample) -> None:
            self._hand_over(sender, (sample.kind == zenoh.SampleKind.PUT, str(sample.key_expr)))

        subscriber = self.session.liveliness().declare_subscriber(key, on_sample, history=True)
        self._declarations.append(subscriber)
        return receiver

    def answer_queries(self, key: str, answer: Callable[[], BaseModel | None]) -> None:
        """Reply to queries on `key` with `answer()` (called on a zenoh thread; None means stay silent)."""

        def on_query(query: zenoh.Query) -> None:
            reply = answer()
            if reply is not None:
                query.reply(key, reply.model_dump_json().encode())

        self._declarations.append(self.session.declare_queryable(key, on_query))

    def answer_queries_with(self, key: str, reply: BaseModel) -> None:
        """Reply to queries on `key` with the same `reply`, encoded once (a large one costs no encoding a query)."""
        payload = reply.model_dump_json().encode()
        self._declarations.append(self.session.declare_queryable(key, lambda query: query.reply(key, payload)))

    async def query(self, key: str, adapter: TypeAdapter[T], timeout: float) -> list[T]:
        """Every valid reply to a query on `key` that arrives within `timeout` seconds."""
        return [message for _, message in await self.query_repliers(key, adapter, timeout)]

    async def query_repliers(self, key: str, adapter: TypeAdapter[T], timeout: float) -> list[tuple[str, T]]:
        """(zenoh id of the session that replied, reply) for every valid reply to a query on `key`."""

        def collect() -> list[tuple[str, T]]:
            replies: list[tuple[str, T]] = []
            for reply in self.session.get(key, timeout=timeout):
                sample = reply.ok
                if sample is None:
                    continue
                message = self._validate(str(sample.key_expr), sample.payload.to_bytes(), adapter)
                replier = reply.replier_id
                if message is not None and replier is not None:
                    replies.append((str(replier.zid), message))
            return replies

        return await anyio.to_thread.run_sync(collect)

    async def round_trip(self, key: str, adapter: TypeAdapter[T], replier: str, timeout: float) -> float | None:
        """Seconds from sending a query on `key` to the first valid reply from the session `replier` (a zenoh id),
        timed on the thread that waits for it so the event loop's scheduling is not counted; None when none came
        within `timeout`."""

        def timed() -> float | None:
            started = time.perf_counter()
            for reply in self.session.get(key, timeout=timeout, consolidation=zenoh.ConsolidationMode.NONE):
                elapsed = time.perf_counter() - started
                sample = reply.ok
                if sample is None or reply.replier_id is None or str(reply.replier_id.zid) != replier:
                    continue
                if self._validate(str(sample.key_expr), sample.payload.to_bytes(), adapter) is not None:
                    return elapsed
            return None

        return await anyio.to_thread.run_sync(timed)

    async def close(self) -> None:
        """Leave the cluster: peers see this node's tokens go at once."""
        for sender in self._senders:
            sender.close()
        self._declarations.clear()
        await anyio.to_thread.run_sync(self.session.close)

    def _validate(self, key: str, payload: bytes, adapter: TypeAdapter[T]) -> T | None:
        if len(payload) > MAX_MESSAGE_BYTES:
            self._drop(key, f"{len(payload)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
            return None
        try:
            return adapter.validate_json(payload)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "message"
            self._drop(key, f"{where}: {first['msg']} ({error.error_count()} problem(s))")
            return None

    def _drop(self, key: str, reason: str) -> None:
        self.dropped_messages += 1
        self._drops_since_log[key] = self._drops_since_log.get(key, 0) + 1
        now = time.monotonic()
        if now - self._last_drop_log.get(key, -math.inf) >= DROP_LOG_INTERVAL_SECONDS:
            count = self._drops_since_log.pop(key)
            self._last_drop_log[key] = now
            logger.warning("dropped %d invalid message(s) from the network on %s: %s", count, key, reason)

    def _hand_over_here(self, sender: MemoryObjectSendStream[T], item: T) -> None:
        """At once on the event loop's thread; from any other, as a zenoh thread hands over."""
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if not here:
            self._hand_over(sender, item)
            return
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            sender.send_nowait(item)

    def _hand_over(self, sender: MemoryObjectSendStream[T], item: T) -> None:
        """From a zenoh thread onto the event loop, without blocking zenoh."""

        def deliver() -> None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                sender.send_nowait(item)

        with contextlib.suppress(RuntimeError):  # the loop already closed: the node is shutting down
            self._loop.call_soon_threadsafe(deliver)
