"""The prefix cache's disk tier across a runner restart, on a real runner: a new session with a known system prompt
is served from the snapshot the previous process wrote, with the answer of a cold run; a damaged snapshot is
rejected and the request still gets that answer."""

from pathlib import Path

import anyio

from exo.shared.types.chunks import Chunk, FinishChunk, PrefillProgressChunk, TokenChunk
from exo.worker.runner.runner_config import RunnerConfig
from tests.exo_server import fixture_model
from tests.worker.runner.tasks import MODEL, collect, running_supervisor, session_task


def _config(home: Path | None) -> RunnerConfig:
    return RunnerConfig(
        model_id=MODEL,
        model_path=fixture_model(MODEL),
        prefix_cache_bytes=1 << 28 if home else 0,
        prefix_cache_dir=home,
        prefix_cache_disk_bytes=1 << 30 if home else 0,
    )


async def _answer(config: RunnerConfig, question: str, *, wait_for_snapshot: Path | None = None) -> list[Chunk]:
    async with running_supervisor(config=config) as supervisor:
        chunks = await collect(supervisor.submit(session_task(question)))
        if wait_for_snapshot is not None:
            with anyio.fail_after(60):  # written while the runner is idle, after the answer went out
                while not list(wait_for_snapshot.glob("*/*.json")):
                    await anyio.sleep(0.1)
    return chunks


def _text(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


def _finish(chunks: list[Chunk]) -> FinishChunk:
    assert isinstance(chunks[-1], FinishChunk), chunks
    return chunks[-1]


async def test_after_a_restart_a_new_session_is_served_from_disk_with_the_cold_answer(tmp_path: Path) -> None:
    cold = await _answer(_config(None), "Which file holds the tests?")
    await _answer(_config(tmp_path), "How do I run the linter?", wait_for_snapshot=tmp_path)

    restarted = await _answer(_config(tmp_path), "Which file holds the tests?")

    usage = _finish(restarted).usage
    assert usage.disk_cached_tokens > 200  # the system prompt, read from disk
    assert usage.cached_tokens == usage.disk_cached_tokens
    start = restarted[0]
    assert isinstance(start, PrefillProgressChunk)
    assert start.disk_cached_tokens == usage.disk_cached_tokens
    assert _text(cold)
    assert _text(restarted) == _text(cold)
    assert _finish(restarted).finish_reason == _finish(cold).finish_reason


async def test_a_corrupted_snapshot_is_rejected_after_a_restart_and_the_answer_is_the_cold_one(
    tmp_path: Path,
) -> None:
    cold = await _answer(_config(None), "Which file holds the tests?")
    await _answer(_config(tmp_path), "How do I run the linter?", wait_for_snapshot=tmp_path)
    (snapshot,) = tmp_path.glob("*/*.safetensors")
    contents = bytearray(snapshot.read_bytes())
    contents[len(contents) // 2] ^= 0xFF
    snapshot.write_bytes(bytes(contents))

    restarted = await _answer(_config(tmp_path), "Which file holds the tests?")

    assert _finish(restarted).usage.cached_tokens == 0
    assert _text(restarted) == _text(cold)
    assert not snapshot.exists()
