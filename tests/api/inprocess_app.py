"""The real FastAPI app in process, in front of a scripted master instead of a cluster.

Everything in the API is the production code (guard middleware, validation, adapters, SSE encoding, the cluster
views); only what lies behind the master client (placement, workers, runners) is replaced, so API behaviour is
tested in milliseconds. The bus path behind the master client is tested with real nodes (tests/cluster).
"""

from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol

from fastapi import FastAPI

from exo.api.app import create_app
from exo.master.client import TaskHandle
from exo.node import NodeConfig, api_settings
from exo.shared.errors import InstancePlacementError
from exo.shared.types.chunks import Chunk, FinishChunk, TokenChunk, Usage
from exo.shared.types.cluster_api import DiscoveryReport, PeerConnection
from exo.shared.types.commands import CancelTaskCommand, GenerateCommand
from exo.shared.types.common import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo.shared.types.instances import PlacedInstance
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.request_record import RequestRecord
from exo.shared.types.state import (
    NodeFacts,
    NodeHealth,
    NodeInfo,
    NodeMemory,
    RunnerInfo,
    State,
)
from exo.shared.types.worker.runner_response import ModelMetadata
from exo.shared.types.worker.shards import ParallelChoice, ShardAssignment

SCRIPTED_MODEL = ModelId("scripted-model")
SCRIPTED_REPLY = "scripted reply"
SCRIPTED_NODE = NodeId("5c419e0000000000000000000000a11e")


class ResponseLike(Protocol):
    """What response assertions read; httpx's and the TestClient's responses (a vendored httpx) both have it."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    def json(self) -> Any: ...


def scripted_state() -> State:
    """One healthy node serving SCRIPTED_MODEL with one ready runner."""
    facts = NodeFacts(
        node_id=SCRIPTED_NODE,
        name="scripted",
        cluster_endpoints=("tcp/127.0.0.1:52414",),
        api_port=52415,
        platform="test",
        device="test (1 cores)",
        mlx_backend="cpu",
        memory=NodeMemory(total_bytes=8 * 1024**3, available_bytes=4 * 1024**3),
        exo_version="0.1.0",
        serves_models=True,
        started_at=1.0,
    )
    runner = RunnerInfo(
        runner_id=RunnerId("runner-scripted"),
        node_id=SCRIPTED_NODE,
        instance_id=InstanceId("instance-scripted"),
        model_id=SCRIPTED_MODEL,
        model_path="/nonexistent/scripted-model",
        shard=ShardAssignment(),
        status="ready",
        metadata=ModelMetadata(
            context_length=4096, tool_format="hermes", supports_reasoning=False, dtype="float32", vocab_size=741
        ),
    )
    node = NodeInfo(facts=facts, last_seen=2.0, health=NodeHealth(status="healthy"))
    return State(
        master_node_id=SCRIPTED_NODE,
        last_event_index=2,
        nodes={SCRIPTED_NODE: node},
        runners={runner.runner_id: runner},
    )


SCRIPTED_CHUNKS: tuple[Chunk, ...] = (
    TokenChunk(text=SCRIPTED_REPLY),
    FinishChunk(finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=2)),
)


class ScriptedMaster:
    """A MasterClient that answers every completion with `script` (SCRIPTED_REPLY unless a test sets another, or a
    subclass answers per command in `chunks_for`) and records what it was given."""

    def __init__(self) -> None:
        self.tasks: list[GenerateCommand] = []
        self.script: tuple[Chunk, ...] = SCRIPTED_CHUNKS
        self.cancelled: list[TaskId] = []
        self.peers_added: list[str] = []
        self.preparations: list[ModelPreparation] = []
        self.requests: list[RequestRecord] = []
        self.state = scripted_state()
        self.node_id = SCRIPTED_NODE
        self.cluster_name = "scripted"

    def chunks_for(self, command: GenerateCommand) -> tuple[Chunk, ...]:  # noqa: ARG002 - one script for all
        return self.script

    async def submit_chat_completion(self, command: GenerateCommand) -> TaskHandle:
        self.tasks.append(command)
        script = self.chunks_for(command)

        async def chunks() -> AsyncGenerator[Chunk, None]:
            for chunk in script:
                yield chunk

        return TaskHandle(task_id=TaskId(f"task-{len(self.tasks)}"), node_id=SCRIPTED_NODE, chunks=chunks())

    def cancel(self, command: CancelTaskCommand) -> None:
        self.cancelled.append(command.task_id)

    def record_request(self, record: RequestRecord) -> None:
        self.requests.append(record)

    async def add_peer(self, endpoint: str) -> PeerConnection:
        self.peers_added.append(endpoint)
        return PeerConnection(endpoint=endpoint, node_id="scripted-peer", joined=True)

    async def discover(self) -> DiscoveryReport:
        return DiscoveryReport(found=[])

    async def place_instance(self, spec: str, min_nodes: int, parallel: ParallelChoice = "auto") -> PlacedInstance:
        if parallel == "tensor":
            raise InstancePlacementError(
                f"scripted: {spec} has 3 heads, not divisible by {min_nodes}", "indivisible_heads"
            )
        raise InstancePlacementError(f"scripted: {spec} does not fit over {min_nodes} nodes")


def scripted_app(
    config: NodeConfig | None = None, master: ScriptedMaster | None = None
) -> tuple[FastAPI, ScriptedMaster]:
    """The production app in front of a ScriptedMaster (or `master`) serving SCRIPTED_MODEL."""
    config = config or NodeConfig()
    master = master or ScriptedMaster()
    settings = api_settings(config)
    return create_app(master, settings, master.preparations.append), master
