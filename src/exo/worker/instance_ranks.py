"""The ranks this node runs for the instances the master placed: started when an instance names this node, stopped
when it leaves the state. A rank whose node lacks the model's files first copies exactly its layers' files from the
node that holds the checkpoint (checked by sha256, renamed into place), with progress in /state."""

import dataclasses
import logging
import re
from collections.abc import Callable, Coroutine
from pathlib import Path

import anyio
import anyio.to_thread
import zenoh
from anyio.abc import TaskGroup

from exo.cluster.event_log import EventLog
from exo.models.peer_fetch import PeerFiles, fetch_model_files
from exo.models.progress import PreparationSink, PreparationTracker
from exo.shared.types.common import InstanceId, ModelId, NodeId, RunnerId
from exo.shared.types.instances import PlacedInstance, RankPlacement
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.supervisor import RunnerSupervisor

logger = logging.getLogger(__name__)

# Checked at least this often even without a state change (a missed wake-up costs no more than this).
RECHECK_SECONDS = 5.0

RankKey = tuple[InstanceId, int]


@dataclasses.dataclass(frozen=True)
class RankHost:
    """What the ranks need from their node's worker."""

    node_id: NodeId
    session: zenoh.Session
    topics_root: str
    models_dir: Path
    local_model_path: Callable[[ModelId], Path | None]
    runner_config_for: Callable[[ModelId, Path], RunnerConfig]
    start_runner: Callable[[RunnerConfig, InstanceId], RunnerSupervisor]
    remove_runner: Callable[[RunnerId], Coroutine[None, None, None]]
    progress_sinks: tuple[PreparationSink, ...]


class InstanceRanks:
    def __init__(self, host: RankHost, event_log: EventLog, task_group: TaskGroup) -> None:
        self._host = host
        self._event_log = event_log
        self._task_group = task_group
        # Ranks started (or being started) here; None while their files are being fetched.
        self._runners: dict[RankKey, RunnerId | None] = {}

    async def run(self) -> None:
        while True:
            seen = self._event_log.state
            self._reconcile(seen.instances)
            await self._event_log.wait_for(lambda state, seen=seen: state is not seen, RECHECK_SECONDS)

    def _reconcile(self, instances: dict[InstanceId, PlacedInstance]) -> None:
        wanted = {
            (instance.instance_id, placement.rank): (instance, placement)
            for instance in instances.values()
            for placement in instance.ranks_on(self._host.node_id)
        }
        for key, (instance, placement) in wanted.items():
            if key not in self._runners:
                self._runners[key] = None
                self._task_group.start_soon(self._start, instance, placement, name=f"rank-{key[0]}-{key[1]}")
        for key in [key for key in self._runners if key not in wanted]:
            runner_id = self._runners.pop(key)
            if runner_id is not None:
                logger.info("instance %s is gone: stopping rank %d", key[0], key[1])
                self._task_group.start_soon(self._host.remove_runner, runner_id)

    async def _start(self, instance: PlacedInstance, placement: RankPlacement) -> None:
        key = (instance.instance_id, placement.rank)
        try:
            path = await anyio.to_thread.run_sync(self._model_files, instance, placement)
        except Exception as error:
            logger.error("rank %d of %s cannot get its files: %s", placement.rank, instance.model_id, error)
            path = self._peer_dir(instance.model_id)  # the runner then fails to load and says which file is missing
        if key not in self._runners:
            return  # the instance went away while the files came
        config = dataclasses.replace(
            self._host.runner_config_for(instance.model_id, path), shard=instance.shard(placement.rank)
        )
        supervisor = self._host.start_runner(config, instance.instance_id)
        self._runners[key] = supervisor.runner_id
        logger.info(
            "rank %d of instance %s (%s, layers %d-%d) started",
            placement.rank,
            instance.instance_id,
            instance.model_id,
            placement.start_layer,
            placement.end_layer - 1,
        )

    def _model_files(self, instance: PlacedInstance, placement: RankPlacement) -> Path:
        """Runs in a thread: this node's copy of the model, or the rank's files copied from the node that has them."""
        local = self._host.local_model_path(instance.model_id)
        if local is not None:
            return local
        target = self._peer_dir(instance.model_id)
        tracker = PreparationTracker(instance.model_id, self._host.progress_sinks)
        peer = PeerFiles(self._host.session, self._host.topics_root, instance.files_from, instance.model_id)
        try:
            copied = fetch_model_files(peer, target, placement.start_layer, placement.end_layer, tracker)
        except Exception as error:
            if tracker.last is not None:
                tracker.fail(str(error))
            raise
        if tracker.last is not None:
            tracker.finish()
        logger.info("copied %d files of %s from node %s", len(copied), instance.model_id, instance.files_from)
        return target

    def _peer_dir(self, model_id: ModelId) -> Path:
        return self._host.models_dir / "from-peers" / re.sub(r"[^A-Za-z0-9._-]", "_", model_id)
