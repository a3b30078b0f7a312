"""A task the supervisor holds for its runner: queued, prefilling or decoding, and where its chunks go."""

import contextlib
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from exo.shared.types.chunks import Chunk, ErrorChunk, PrefillProgressChunk
from exo.shared.types.state import TaskPhase
from exo.shared.types.tasks import GenerationTask


@dataclass
class PendingTask:
    task: GenerationTask
    sender: MemoryObjectSendStream[Chunk]
    failed: bool = False
    progress: PrefillProgressChunk | None = None
    decoding: bool = False
    # Tokens of this task already counted in the runner's rate.
    counted_tokens: int = 0

    @property
    def phase(self) -> TaskPhase:
        return "decode" if self.decoding else "prefill" if self.progress is not None else "queued"

    def deliver(self, chunk: Chunk) -> None:
        """Pass `chunk` on; a consumer that already went away (the client disconnected) just misses it."""
        if isinstance(chunk, ErrorChunk):
            self.failed = True
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.sender.send_nowait(chunk)
