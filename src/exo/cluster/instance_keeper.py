"""The instances this node asked for: `exo --model M --min-nodes N` and `POST /v1/cluster/instances`.

The node holding a model's files asks the master to place it over at least N nodes, as soon as N are up, and asks
again whenever its instance leaves the state with none in its place (the master itself places an instance that lost
a node again at once, see master/main.py). Availability first: once it was placed over N
nodes, losing one does not take it away: with fewer than N nodes up it is placed over the nodes that are (a degraded
instance) when they can hold it, and placed again over N nodes once that many are up; the degraded instance serves
until the new one does. Refusals (it fits nowhere) are recorded in the state, so the API's 503 and the log say why.
"""

import logging
from dataclasses import dataclass
from pathlib import Path

import anyio

from exo.cluster.bus import Bus
from exo.cluster.event_log import EventLog
from exo.cluster.topics import Topics
from exo.models.footprint import read_footprint
from exo.shared.apply import is_up
from exo.shared.errors import InstancePlacementError, NoMasterError
from exo.shared.types.common import ModelId, NodeId, new_command_id
from exo.shared.types.instances import (
    InstancePlacementReply,
    InstancePlacementReplyAdapter,
    PlacedInstance,
    PlaceInstance,
)
from exo.shared.types.state import State
from exo.shared.types.worker.shards import ParallelChoice

logger = logging.getLogger(__name__)

REPLY_TIMEOUT_SECONDS = 30.0
RECHECK_SECONDS = 2.0
# A request waiting for its answer is sent again when the master changes (only the master it is sent to answers).
MASTER_CHECK_SECONDS = 0.5


@dataclass
class _Wanted:
    request: PlaceInstance
    model_path: Path
    last_error: str | None = None
    # It was placed over the nodes asked for once: from then on losing a node leaves it serving on fewer (degraded).
    spread_once: bool = False


class InstanceKeeper:
    def __init__(self, bus: Bus, topics: Topics, event_log: EventLog, node_id: NodeId) -> None:
        self._bus = bus
        self._topics = topics
        self._event_log = event_log
        self._node_id = node_id
        self._wanted: dict[ModelId, _Wanted] = {}
        self._waiting: dict[str, anyio.Event] = {}
        self._replies: dict[str, InstancePlacementReply] = {}
        self._subscription = bus.subscribe(topics.instance_replies(node_id), InstancePlacementReplyAdapter)

    def local_model_path(self, model_id: ModelId) -> Path | None:
        wanted = self._wanted.get(model_id)
        return wanted.model_path if wanted is not None else None

    def want(
        self, model_id: ModelId, model_path: Path, min_nodes: int, parallel: ParallelChoice = "auto"
    ) -> PlaceInstance:
        """Keep `model_id` (files at `model_path`) placed over at least `min_nodes` nodes from now on, split as
        `parallel` says."""
        request = PlaceInstance(
            request_id=new_command_id(),
            model_id=model_id,
            min_nodes=min_nodes,
            footprint=read_footprint(model_path),
            files_from=self._node_id,
            parallel=parallel,
        )
        self._wanted[model_id] = _Wanted(request=request, model_path=model_path)
        logger.info("%s is to be placed over at least %d nodes (as soon as that many are up)", model_id, min_nodes)
        return request

    async def place(
        self, model_id: ModelId, model_path: Path, min_nodes: int, parallel: ParallelChoice = "auto"
    ) -> PlacedInstance:
        """Place `model_id` now and return the instance; raises InstancePlacementError or NoMasterError."""
        before = self._wanted.get(model_id)
        reply = await self._ask(self.want(model_id, model_path, min_nodes, parallel))
        if reply.instance is None:
            # A refused request is not retried behind the caller's back; what was wanted before still is.
            if before is None:
                del self._wanted[model_id]
            else:
                self._wanted[model_id] = before
            raise InstancePlacementError(reply.error or "the master refused the placement", reply.refusal)
        return reply.instance

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._receive)
            group.start_soon(self._keep_placed)

    async def _receive(self) -> None:
        async with self._subscription as replies:
            async for reply in replies:
                event = self._waiting.pop(reply.request_id, None)
                if event is not None:
                    self._replies[reply.request_id] = reply
                    event.set()

    async def _ask(self, request: PlaceInstance) -> InstancePlacementReply:
        request = request.model_copy(update={"request_id": new_command_id()})
        answered = self._waiting[request.request_id] = anyio.Event()
        sent_to: NodeId | None = None
        with anyio.move_on_after(REPLY_TIMEOUT_SECONDS):
            while not answered.is_set():
                master = self._event_log.leader
                if master is not None and master != sent_to:
                    self._bus.publish(self._topics.master_commands(master), request)
                    sent_to = master
                with anyio.move_on_after(MASTER_CHECK_SECONDS):
                    await answered.wait()
        self._waiting.pop(request.request_id, None)
        reply = self._replies.pop(request.request_id, None)
        if reply is None:
            raise NoMasterError(f"no cluster master answered a placement within {REPLY_TIMEOUT_SECONDS:.0f} s")
        return reply

    async def _keep_placed(self) -> None:
        while True:
            state = self._event_log.state
            for model_id, wanted in list(self._wanted.items()):
                request = self._request_now(state, model_id, wanted)
                if request is None:
                    continue
                try:
                    reply = await self._ask(request)
                except NoMasterError as error:
                    logger.warning("%s", error)
                    continue
                if reply.error is not None and reply.error != wanted.last_error:
                    logger.error("cannot place %s yet: %s", model_id, reply.error)
                wanted.last_error = reply.error
            await anyio.sleep(RECHECK_SECONDS)

    def _request_now(self, state: State, model_id: ModelId, wanted: _Wanted) -> PlaceInstance | None:
        """What to ask the master now: a placement over the nodes up (none placed yet), the spread asked for (a
        degraded instance serves and enough nodes are back), or nothing."""
        current = self._current(state, model_id)
        if current is None:
            return wanted.request.model_copy(update={"allow_fewer": wanted.spread_once, "kept": True})
        if current.degraded_reason is None:
            wanted.spread_once = True
        up = sum(is_up(state, node_id) for node_id in state.nodes)
        if current.degraded_reason is not None and up >= wanted.request.min_nodes:
            return wanted.request
        return None

    def _current(self, state: State, model_id: ModelId) -> PlacedInstance | None:
        """The newest instance of `model_id` placed for this node (a replacement is newer than what it replaces)."""
        mine = [
            instance
            for instance in state.instances.values()
            if instance.model_id == model_id and instance.files_from == self._node_id
        ]
        return max(mine, key=lambda instance: instance.placed_at, default=None)
