"""Where models live on disk stays in the logs, not in what the API answers (unless the operator asks for it).

Paths reach the API in the worker's words: a runner's `model_path` in /state, and messages that name it (a model
that failed to load, a runner that is unavailable, a model still being prepared). Each is replaced by a label:
a model's directory by `<model ID>`, the models directory by `<models dir>`, exo's home by `<exo home>` and the
user's home by `~`. `--show-model-paths` keeps them as they are.
"""

import contextlib
import functools
from collections.abc import AsyncGenerator, Callable, Iterable
from pathlib import Path

from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.state import State

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
    """Replaces the node's model paths and storage directories in text with labels."""

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
        """`state` with every model path and error message hidden."""
        runners = {
            runner_id: runner.model_copy(
                update={
                    "model_path": f"<{runner.model_id}>",
                    "last_error": self.text(runner.last_error) if runner.last_error else None,
                }
            )
            for runner_id, runner in state.runners.items()
        }
        preparations = {
            model_id: preparation.model_copy(update={"error": self.text(preparation.error)})
            if preparation.error
            else preparation
            for model_id, preparation in state.preparations.items()
        }
        return state.model_copy(update={"runners": runners, "preparations": preparations})


def storage_directories(models_dir: Path, exo_home: Path) -> list[tuple[Path, str]]:
    """The directories hidden besides the models themselves, each with its label."""
    return [(models_dir, "<models dir>"), (exo_home, "<exo home>"), (Path.home(), "~")]


async def hide_in_errors(chunks: AsyncGenerator[Chunk, None], hide: TextFilter) -> AsyncGenerator[Chunk, None]:
    """`chunks`, with the message of an ErrorChunk passed through `hide`."""
    try:
        async for chunk in chunks:
            yield chunk.model_copy(update={"message": hide(chunk.message)}) if isinstance(chunk, ErrorChunk) else chunk
    finally:
        await chunks.aclose()
