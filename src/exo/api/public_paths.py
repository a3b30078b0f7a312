"""Where models live on disk stays in the logs, not in what the API answers (unless the operator asks for it).

Paths reach the API in the workers' words: a runner's `model_path` and BLAS library (then named by its file alone)
in the cluster state, and messages that name it (a model that failed to load, a runner that is unavailable, a
preparation that failed, a failed task or request).
Each is replaced by a label: a model's directory by `<model ID>`, this node's models directory by `<models dir>`,
exo's home by `<exo home>` and the user's home by `~`. `PublicMasterClient` applies that to everything the API reads
from the master, so every route (present and future) answers without paths; `--show-model-paths` leaves them as they
are.
"""

import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, Callable, Iterable
from pathlib import Path, PurePath

from exo.master.client import MasterClient, TaskHandle
from exo.shared.errors import ExoModelError, InstancePlacementError, RunnerUnavailableError
from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.cluster_api import DiscoveryReport, PeerConnection
from exo.shared.types.commands import CancelTaskCommand, GenerateCommand
from exo.shared.types.common import NodeId
from exo.shared.types.instances import PlacedInstance
from exo.shared.types.request_record import RequestRecord
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import ModelMetadata
from exo.shared.types.worker.shards import ParallelChoice

TextFilter = Callable[[str], str]


@functools.lru_cache(maxsize=256)
def _spellings(path: str) -> frozenset[str]:
    """`path` as given and as an absolute, resolved path (messages use either); cached, as the set of model
    paths only changes when a runner is added."""
    spellings = {path}
    with contextlib.suppress(OSError, RuntimeError):  # an unresolvable path is only hidden as given
        spellings.add(str(Path(path).expanduser().resolve()))
    return frozenset(spelling for spelling in spellings if spelling not in ("", ".", "/"))


class PathHider:
    """Replaces the cluster's model paths and this node's storage directories in text with labels."""

    def __init__(self, state: State, directories: Iterable[tuple[Path, str]]) -> None:
        replacements: dict[str, str] = {}
        for directory, label in directories:
            replacements.update(dict.fromkeys(_spellings(str(directory)), label))
        for runner in state.runners.values():
            replacements.update(dict.fromkeys(_spellings(runner.model_path), f"<{runner.model_id}>"))
        # Longest first, so a model directory inside the models directory gets its own label.
        self._replacements = sorted(replacements.items(), key=lambda item: len(item[0]), reverse=True)

    def text(self, text: str) -> str:
        for path, label in self._replacements:
            text = text.replace(path, label)
        return text

    def state(self, state: State) -> State:
        """`state` with every model path hidden, in messages too (runners' errors, a node's health, preparations
        and recent requests)."""
        runners = {
            runner_id: runner.model_copy(
                update={
                    "model_path": f"<{runner.model_id}>",
                    "last_error": self.text(runner.last_error) if runner.last_error else None,
                    "metadata": _public_metadata(runner.metadata),
                }
            )
            for runner_id, runner in state.runners.items()
        }
        nodes = {
            node_id: node.model_copy(
                update={
                    "preparing": tuple(self.text(spec) for spec in node.preparing),
                    "health": node.health.model_copy(update={"reason": self.text(node.health.reason)})
                    if node.health.reason
                    else node.health,
                    "preparations": {
                        model_id: preparation.model_copy(update={"error": self.text(preparation.error)})
                        if preparation.error
                        else preparation
                        for model_id, preparation in node.preparations.items()
                    },
                    "recent_requests": tuple(
                        request.model_copy(update={"error": self.text(request.error)}) if request.error else request
                        for request in node.recent_requests
                    ),
                }
            )
            for node_id, node in state.nodes.items()
        }
        return state.model_copy(update={"runners": runners, "nodes": nodes})


def _public_metadata(metadata: ModelMetadata | None) -> ModelMetadata | None:
    """The runner's metadata with its BLAS library named by file, not by where the install put it."""
    if metadata is None or metadata.blas is None or metadata.blas.library is None:
        return metadata
    blas = metadata.blas.model_copy(update={"library": PurePath(metadata.blas.library).name})
    return metadata.model_copy(update={"blas": blas})


def storage_directories(models_dir: Path, exo_home: Path) -> list[tuple[Path, str]]:
    """The directories hidden besides the models themselves, each with its label."""
    return [(models_dir, "<models dir>"), (exo_home, "<exo home>"), (Path.home(), "~")]


def directory_hider(directories: Iterable[tuple[Path, str]]) -> TextFilter:
    """Replaces this node's storage directories in text with their labels (for answers that name no runner)."""
    return PathHider(State(), directories).text


def names_a_local_path(spec: str) -> bool:
    """Whether a model spec is written as a path on the node (`/…`, `~…`, `./…`, `../…`) rather than an id."""
    return spec.startswith(("/", "~", "."))


class LocalModelRefusedError(ValueError):
    """A model spec written as a path could not be prepared; the message is the same whatever the path holds."""

    def __init__(self) -> None:
        super().__init__(
            "no model this node can load at that path (the node's log says why; a catalog id or a model the cluster "
            "serves needs no path)"
        )


async def hide_in_errors(chunks: AsyncGenerator[Chunk, None], hide: TextFilter) -> AsyncGenerator[Chunk, None]:
    """`chunks`, with the message of an ErrorChunk passed through `hide`."""
    try:
        async for chunk in chunks:
            yield chunk.model_copy(update={"message": hide(chunk.message)}) if isinstance(chunk, ErrorChunk) else chunk
    finally:
        await chunks.aclose()


class PublicMasterClient:
    """`master` as the API shows it: its state, refusals and task errors without paths on disk."""

    def __init__(self, master: MasterClient, directories: Iterable[tuple[Path, str]]) -> None:
        self._master = master
        self._directories = tuple(directories)
        # The state is immutable and replaced on every change: the hidden copy is made once per version.
        self._seen: tuple[State, State, PathHider] | None = None

    def _hidden(self) -> tuple[State, PathHider]:
        state = self._master.state
        if self._seen is None or self._seen[0] is not state:
            hider = PathHider(state, self._directories)
            self._seen = (state, hider.state(state), hider)
        return self._seen[1], self._seen[2]

    @property
    def node_id(self) -> NodeId:
        return self._master.node_id

    @property
    def cluster_name(self) -> str:
        return self._master.cluster_name

    @property
    def state(self) -> State:
        return self._hidden()[0]

    async def submit_chat_completion(self, command: GenerateCommand) -> TaskHandle:
        hider = self._hidden()[1]
        try:
            handle = await self._master.submit_chat_completion(command)
        except RunnerUnavailableError as error:  # the reason may quote the model's files
            raise RunnerUnavailableError(hider.text(str(error))) from error
        return dataclasses.replace(handle, chunks=hide_in_errors(handle.chunks, hider.text))

    def cancel(self, command: CancelTaskCommand) -> None:
        self._master.cancel(command)

    def record_request(self, record: RequestRecord) -> None:
        self._master.record_request(record)

    async def add_peer(self, endpoint: str) -> PeerConnection:
        return await self._master.add_peer(endpoint)

    async def discover(self) -> DiscoveryReport:
        return await self._master.discover()

    async def place_instance(self, spec: str, min_nodes: int, parallel: ParallelChoice = "auto") -> PlacedInstance:
        try:
            return await self._master.place_instance(spec, min_nodes, parallel)
        except InstancePlacementError:
            raise  # the model was found; the memory it needs is no secret
        except (ExoModelError, OSError, ValueError) as error:
            # Why a path could not be prepared (missing, not a directory, no weights, unreadable) would tell a client
            # what exists on the node's disk: one answer for them all. Other specs' reasons keep their words.
            if names_a_local_path(spec):
                raise LocalModelRefusedError from error
            raise type(error)(self._hidden()[1].text(str(error))) from error
