"""A runner that is never idle still writes its sessions' disk snapshots once its queue is past half its budget: the
write runs beside the decoding of the other requests, which answer as they do without a disk tier, and a restarted
runner is served from that snapshot."""

import json
from pathlib import Path

import anyio
from transformers import AutoTokenizer

from exo.shared.types.chunks import Chunk, FinishChunk, TokenChunk
from exo.shared.types.common import new_command_id, new_task_id
from exo.shared.types.tasks import GenerationParams, GenerationTask, PromptMessage, SamplingParams, StructuredOutput
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.exo_server import fixture_model
from tests.worker.runner.tasks import AGENT_SYSTEM_PROMPT, MODEL, collect, running_supervisor, session_task

SESSION_QUESTION = "How do I run the linter?"
LONG_NOTE_SCHEMA = {
    "type": "object",
    "properties": {"note": {"type": "string", "minLength": 1500}},
    "required": ["note"],
}
TOKENS_STILL_TO_COME = 100
"""The snapshot must be on disk while at least this many of the long request's chunks were yet to arrive: written
only when idle, it could not be before that request ended."""


def _long_task() -> GenerationTask:
    """Hundreds of tokens, whatever the tiny model would rather say: the grammar asks for a 1,500-character note."""
    return GenerationTask(
        task_id=new_task_id(),
        command_id=new_command_id(),
        model_id=MODEL,
        params=GenerationParams(
            messages=(PromptMessage(role="user", content="Write a long note about the weather."),),
            sampling=SamplingParams(max_tokens=1200),
            structured_output=StructuredOutput(json_schema=LONG_NOTE_SCHEMA),  # pyright: ignore[reportArgumentType]
        ),
    )


def _kv_bytes_per_token() -> int:
    """The fixture's KV cache bytes a token (float32 on a CPU), from its config."""
    config = json.loads((fixture_model(MODEL) / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 4


def _session_prompt_tokens() -> int:
    tokenizer = AutoTokenizer.from_pretrained(fixture_model(MODEL))
    messages = [{"role": "system", "content": AGENT_SYSTEM_PROMPT}, {"role": "user", "content": SESSION_QUESTION}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer.encode(text))


def _config(home: Path | None) -> RunnerConfig:
    # A prefix cache of one and a half sessions' KV: the session's snapshot is past half of it, so the runner writes it
    # beside decoding instead of waiting for an idle moment.
    return RunnerConfig(
        model_id=MODEL,
        model_path=fixture_model(MODEL),
        prefix_cache_bytes=_session_prompt_tokens() * 3 // 2 * _kv_bytes_per_token() if home else 0,
        prefix_cache_dir=home,
        prefix_cache_disk_bytes=1 << 30 if home else 0,
    )


def _snapshot_written(home: Path) -> bool:
    return bool(list(home.glob("*/*.json")))


async def _long_beside_a_session(supervisor: RunnerSupervisor, home: Path | None) -> tuple[list[Chunk], list[bool]]:
    """The long request's chunks, and for each whether the session's snapshot was on disk when it arrived."""
    session = supervisor.submit(session_task(SESSION_QUESTION, max_tokens=16))
    long_stream = supervisor.submit(_long_task())
    chunks: list[Chunk] = []
    written: list[bool] = []
    async with anyio.create_task_group() as group:
        group.start_soon(collect, session)
        async with long_stream:
            async for chunk in long_stream:
                chunks.append(chunk)
                written.append(home is not None and _snapshot_written(home))
    return chunks, written


def _text(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


async def test_a_snapshot_is_written_while_other_requests_decode_and_serves_a_restart(tmp_path: Path) -> None:
    async with running_supervisor(config=_config(None)) as supervisor:
        without_disk, _ = await _long_beside_a_session(supervisor, None)
    async with running_supervisor(config=_config(tmp_path)) as supervisor:
        with_disk, written = await _long_beside_a_session(supervisor, tmp_path)

    token_chunks = [index for index, chunk in enumerate(with_disk) if isinstance(chunk, TokenChunk)]
    assert len(token_chunks) > 2 * TOKENS_STILL_TO_COME, "the long request must outlast the session's write"
    assert any(written[index] for index in token_chunks[:-TOKENS_STILL_TO_COME])
    finish = with_disk[-1]
    assert isinstance(finish, FinishChunk)
    assert _text(with_disk) == _text(without_disk)  # decoding beside the write is unchanged

    async with running_supervisor(config=_config(tmp_path)) as supervisor:
        restarted = await collect(supervisor.submit(session_task("Which file holds the tests?", max_tokens=16)))
    restarted_finish = restarted[-1]
    assert isinstance(restarted_finish, FinishChunk)
    assert restarted_finish.usage.disk_cached_tokens > 200  # the system prompt, read from disk
