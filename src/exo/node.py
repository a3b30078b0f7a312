"""A node: the API, the master role and the worker in one process, with one runner subprocess per model.

They talk only through the cluster bus (a zenoh session), whether the cluster is this node alone or many: the API
asks the master client, the elected master orders events and places tasks, workers run them. `join` claims the
node's identity and opens the bus, `start` runs the pieces in the caller's task group, `stop` shuts the runners
down and leaves the cluster.
"""

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread
import zenoh
from anyio.abc import TaskGroup

from exo.api.app import ApiSettings
from exo.api.message_count import DEFAULT_MAX_MESSAGES
from exo.api.read_timeouts import DEFAULT_BODY_TIMEOUT_SECONDS, DEFAULT_HEADER_TIMEOUT_SECONDS
from exo.cluster.bus import Bus
from exo.cluster.cluster_tls import tls_link_config
from exo.cluster.event_log import EventLog
from exo.cluster.identity import NodeIdentity, claim_node_identity
from exo.cluster.instance_keeper import InstanceKeeper
from exo.cluster.link_probe import LinkProber
from exo.cluster.membership import Membership
from exo.cluster.memory_bandwidth import measure_memory_bandwidth
from exo.cluster.node_facts import NodeDescriber
from exo.cluster.peers import PeerConnector
from exo.cluster.settings import ClusterSettings, zenoh_config
from exo.cluster.topics import Member, Topics
from exo.master.client import BusMasterClient
from exo.master.main import Master
from exo.models.paths import default_models_dir, exo_home
from exo.models.peer_files import ModelFileServer
from exo.models.progress_display import ConsoleProgress
from exo.shared.api_key_hash import make_verifier
from exo.shared.local_backend import local_weights_in_memory
from exo.shared.types.common import ModelId
from exo.shared.types.cpu_kernels import CpuKernelsSetting, CpuWeightsSetting
from exo.shared.types.instances import PlacedInstance
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.request_record import RequestRecord
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import ParallelChoice
from exo.worker.engines.mlx.cpu.weights_choice import node_weights
from exo.worker.instance_ranks import InstanceRanks, RankHost
from exo.worker.main import Worker
from exo.worker.runner.runner_config import RunnerConfig

logger = logging.getLogger(__name__)


class NodeStartError(RuntimeError):
    """The node cannot join its cluster (its cluster port is taken, its identity is in use…)."""


@dataclass(frozen=True)
class NodeConfig:
    # `None` is the default model; empty for a `--no-model` node.
    models: tuple[str | None, ...] = (None,)
    models_dir: Path | None = None
    host: str = "127.0.0.1"
    api_port: int = 52415
    api_key: str | None = None
    queue_limit: int = 64
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    cpu_kernels: CpuKernelsSetting = "auto"
    # The command line's default is `auto`; a node built in code holds float32 unless it says otherwise.
    cpu_weights: CpuWeightsSetting = "float32"
    prefix_cache_bytes: int = 2 * 1024**3
    # KV snapshots of prompt prefixes under `$EXO_HOME/prefix-cache`, per model; 0 keeps none.
    prefix_cache_disk_bytes: int = 8 * 1024**3
    tool_format_override: str | None = None
    max_request_bytes: int = 32 * 1024 * 1024
    max_request_messages: int = DEFAULT_MAX_MESSAGES
    log_level: int = logging.INFO
    # Let a model's own Python code run while loading (config.json `model_file`, tokenizer auto_map): off unless asked.
    trust_remote_code: bool = False
    # Show where models live on disk in API answers (/state, error messages); they are always in the logs.
    show_model_paths: bool = False
    # A client must send its request headers within this, and may pause its body at most this long (read_timeouts.py).
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    extra_runner_configs: tuple[RunnerConfig, ...] = field(default_factory=tuple)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    # Shown in /v1/cluster; the host name by default.
    node_name: str | None = None
    # Where the node keeps its identity; `$EXO_HOME` (default ~/.cache/exo) when None.
    home: Path | None = None
    # Above 1, each model is placed (by memory) over at least this many nodes of the cluster instead of loaded here.
    min_nodes: int = 1
    # How such a model is split over the nodes (`--parallel`).
    parallel: ParallelChoice = "auto"


def api_settings(config: NodeConfig) -> ApiSettings:
    """What the node's HTTP API takes from its configuration."""
    return ApiSettings(
        config.api_key,
        config.max_request_bytes,
        config.host,
        config.api_port,
        config.models_dir,
        show_model_paths=config.show_model_paths,
        max_request_messages=config.max_request_messages,
        weights_in_memory=local_weights_in_memory(
            config.cpu_kernels, node_weights(config.cpu_weights, config.cpu_kernels)
        ),
    )


async def _measure_memory_bandwidth(describe: NodeDescriber, report: Callable[[], None]) -> None:
    """Measure the node's memory bandwidth (off the event loop) and report it at once: the master may hold a placement
    for it (master/placement_hold.py)."""
    describe.memory_bandwidth = await anyio.to_thread.run_sync(measure_memory_bandwidth)
    report()


@dataclass(frozen=True)
class _JoinedParts:
    bus: Bus
    topics: Topics
    membership: Membership
    event_log: EventLog
    master: Master
    peers: PeerConnector
    master_client: BusMasterClient
    keeper: InstanceKeeper
    file_server: ModelFileServer
    links: LinkProber


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self._started_at = time.time()
        self._identity: NodeIdentity | None = None
        self._parts: _JoinedParts | None = None
        self._worker: Worker | None = None
        # Downloads and conversions show on the console (a bar on a terminal) and in /state.
        self._console_progress = ConsoleProgress()

    @property
    def master_client(self) -> BusMasterClient:
        assert self._parts is not None, "the node joins its cluster first"
        return self._parts.master_client

    async def join(self) -> None:
        """Claim this home's node identity, open the cluster bus and set up the parts that talk over it.

        Raises NodeIdentityError (another node uses this home) or NodeStartError (the cluster port is taken).
        """
        config = self.config
        self._identity = claim_node_identity(config.home or exo_home())
        node_id = self._identity.node_id
        try:
            bus = await Bus.open(zenoh_config(config.cluster, node_id))
        except zenoh.ZError as error:
            self._identity.release()
            listen = ", ".join(config.cluster.listen)
            raise NodeStartError(
                f"cannot open the cluster port ({listen}): {str(error).split(' at ')[0]}; "
                "is another exo node using it? Pass --listen tcp/127.0.0.1:PORT to use another"
            ) from error
        topics = Topics(config.cluster.name)
        membership = Membership(bus, topics, Member(node_id=node_id, started_at_ms=int(self._started_at * 1000)))
        event_log = EventLog(bus, topics, membership)
        peers = PeerConnector(bus, config.cluster, membership)
        keeper = InstanceKeeper(bus, topics, event_log, node_id)
        self._parts = _JoinedParts(
            bus=bus,
            topics=topics,
            membership=membership,
            event_log=event_log,
            master=Master(bus, topics, membership, event_log),
            peers=peers,
            master_client=BusMasterClient(
                bus, topics, membership, event_log, peers, placer=self, record_request=self.publish_request
            ),
            keeper=keeper,
            file_server=ModelFileServer(bus.session, topics.root, node_id),
            links=LinkProber(bus, topics, membership),
        )
        logger.info(
            "node %s joined cluster %r (listening on %s)", node_id, topics.cluster, ", ".join(config.cluster.listen)
        )

    def start(self, task_group: TaskGroup) -> None:
        """Run the node's parts in `task_group`, then prepare and load each configured model in the background."""
        assert self._identity is not None, "join() comes first"
        assert self._parts is not None
        config, parts = self.config, self._parts
        describe = NodeDescriber(
            node_id=self._identity.node_id,
            name=config.node_name or socket.gethostname(),
            listen=config.cluster.listen,
            api_port=config.api_port,
            serves_models=bool(config.models) or bool(config.extra_runner_configs),
            dropped_messages=lambda: parts.bus.dropped_messages,
            started_at=self._started_at,
            api_key_verifier=make_verifier(config.api_key) if config.api_key else None,
            cpu_kernels=config.cpu_kernels,
            cpu_weights=node_weights(config.cpu_weights, config.cpu_kernels),
            links=parts.links.measurements,
        )
        self._worker = worker = Worker(
            task_group,
            parts.bus,
            parts.topics,
            parts.membership,
            describe_node=describe,
            show_progress=self._console_progress,
        )
        ranks = InstanceRanks(
            RankHost(
                node_id=self._identity.node_id,
                session=parts.bus.session,
                topics_root=parts.topics.root,
                models_dir=config.models_dir or default_models_dir(),
                local_model_path=parts.keeper.local_model_path,
                runner_config_for=self._runner_config,
                start_runner=worker.start_runner,
                remove_runner=worker.remove_runner,
                progress_sinks=(self._console_progress, worker.publish_preparation),
            ),
            parts.event_log,
            task_group,
        )
        components = (
            parts.membership,
            parts.event_log,
            parts.master,
            parts.master_client,
            worker,
            parts.peers,
            parts.keeper,
            ranks,
            parts.links,
        )
        for component in components:
            task_group.start_soon(component.run, name=type(component).__name__)
        parts.links.after_measuring(worker.report_in_full)
        task_group.start_soon(_measure_memory_bandwidth, describe, worker.report_in_full)
        place = self._keep_placed if config.min_nodes > 1 else None
        for spec in config.models:
            task_group.start_soon(worker.prepare_and_load, spec, self._runner_config, config.models_dir, place)
        for runner_config in config.extra_runner_configs:
            worker.start_runner(runner_config)

    async def place_instance(self, spec: str, min_nodes: int, parallel: ParallelChoice = "auto") -> PlacedInstance:
        """Place model `spec` (prepared on this node first) over at least `min_nodes` nodes, split as `parallel`
        says, and keep it placed.

        Raises InstancePlacementError (it fits nowhere), NoMasterError, or the preparation's own error.
        """
        assert self._worker is not None, "the node is started first"
        assert self._parts is not None
        resolved = await self._worker.prepare(spec, self.config.models_dir)
        self._parts.file_server.serve(resolved.model_id, resolved.path)
        return await self._parts.keeper.place(resolved.model_id, resolved.path, min_nodes, parallel)

    def _keep_placed(self, model_id: ModelId, model_path: Path) -> None:
        assert self._parts is not None
        self._parts.file_server.serve(model_id, model_path)
        self._parts.keeper.want(model_id, model_path, self.config.min_nodes, self.config.parallel)

    def publish_preparation(self, preparation: ModelPreparation) -> None:
        """Record progress of model work this node does outside its start-up (a catalog download); from a thread."""
        assert self._worker is not None, "the node is started first"
        self._worker.publish_preparation(preparation)

    def publish_request(self, record: RequestRecord) -> None:
        """Record how a request this node's API took ended (the worker reports it with everything the node owns)."""
        assert self._worker is not None, "the node is started first"
        self._worker.record_request(record)

    async def stop(self) -> None:
        """Stop the runners, then leave the cluster (peers see this node go at once)."""
        self._console_progress.close()
        try:
            if self._worker is not None:
                await self._worker.stop()
        finally:
            if self._parts is not None:
                self._parts.file_server.close()
                await self._parts.bus.close()
            if self._identity is not None:
                self._identity.release()

    def kill_runners(self) -> None:
        """Kill the runner processes at once: a second Ctrl-C does not wait for them."""
        if self._worker is not None:
            self._worker.kill_runners()

    def _runner_config(self, model_id: ModelId, model_path: Path) -> RunnerConfig:
        return RunnerConfig(
            model_id=model_id,
            model_path=model_path,
            queue_limit=self.config.queue_limit,
            decode=self.config.decode,
            cpu_kernels=self.config.cpu_kernels,
            cpu_weights=self.config.cpu_weights,
            prefix_cache_bytes=self.config.prefix_cache_bytes,
            prefix_cache_dir=(self.config.home or exo_home()) / "prefix-cache",
            prefix_cache_disk_bytes=self.config.prefix_cache_disk_bytes,
            tool_format_override=self.config.tool_format_override,
            log_level=self.config.log_level,
            trust_remote_code=self.config.trust_remote_code,
            pipeline_tls=(
                tls_link_config(self.config.cluster.key, self.config.cluster.name) if self.config.cluster.key else None
            ),
        )
