"""The runner's channel (`channel.py`): messages are written by the channel's own thread, in the order sent, all of
them before `close` returns; a message changed after `send` goes as it was; a broken pipe is raised to the sender."""

import multiprocessing
import threading
import time

import pytest

from exo.shared.types.chunks import Chunk, TokenChunk
from exo.shared.types.common import TaskId
from exo.shared.types.worker.runner_response import RunnerResponseAdapter, StepOutput, StreamChunks, TaskChunk
from exo.worker.runner import channel as channel_module
from exo.worker.runner.channel import RunnerChannel
from tests.waiting import wait_until


def _chunk(index: int) -> TaskChunk:
    return TaskChunk(task_id=TaskId("t"), chunk=TokenChunk(text=str(index)))


def test_messages_reach_the_pipe_in_order_from_the_channels_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, theirs = multiprocessing.Pipe()
    writers: set[str] = set()
    write = channel_module._write_all  # pyright: ignore[reportPrivateUsage]

    def noting_writer(descriptor: int, data: bytes) -> None:  # which thread writes
        writers.add(threading.current_thread().name)
        write(descriptor, data)

    monkeypatch.setattr(channel_module, "_write_all", noting_writer)
    channel = RunnerChannel(ours)
    for index in range(200):
        channel.send(_chunk(index))
    channel.close()

    read = [RunnerResponseAdapter.validate_json(theirs.recv_bytes()) for _ in range(200)]
    assert read == [_chunk(index) for index in range(200)]
    assert not theirs.poll()
    assert writers == {"runner-channel-writer"}


def test_flush_returns_once_everything_sent_is_written() -> None:
    ours, theirs = multiprocessing.Pipe()
    channel = RunnerChannel(ours)
    for index in range(50):
        channel.send(_chunk(index))
    channel.flush()
    arrived = 0
    while theirs.poll(0):
        theirs.recv_bytes()
        arrived += 1
    assert arrived == 50
    channel.close()


def test_a_message_changed_after_it_was_sent_goes_as_it_was_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, theirs = multiprocessing.Pipe()
    chunks: list[Chunk] = [TokenChunk(text="a")]
    message = StepOutput(streams=[StreamChunks(task_id=TaskId("t"), chunks=chunks, generated_tokens=1)], endings=[])
    gate = threading.Event()
    write = channel_module._write_all  # pyright: ignore[reportPrivateUsage]

    def held_writer(descriptor: int, data: bytes) -> None:  # the write happens only after the change below
        gate.wait(timeout=10)
        write(descriptor, data)

    monkeypatch.setattr(channel_module, "_write_all", held_writer)
    channel = RunnerChannel(ours)
    channel.send(message)
    message.streams[0].chunks.append(TokenChunk(text="b"))
    gate.set()
    channel.close()

    read = RunnerResponseAdapter.validate_json(theirs.recv_bytes())
    assert isinstance(read, StepOutput)
    assert [chunk.text for chunk in read.streams[0].chunks if isinstance(chunk, TokenChunk)] == ["a"]


def test_a_broken_pipe_is_raised_to_the_sender() -> None:
    ours, theirs = multiprocessing.Pipe()
    channel = RunnerChannel(ours)
    theirs.close()
    channel.send(_chunk(0))  # queued: the write fails on the channel's thread
    with pytest.raises(BrokenPipeError):
        channel.flush()
    with pytest.raises(BrokenPipeError):
        channel.send(_chunk(1))
    channel.close()


def test_a_large_message_is_framed_as_the_supervisors_reader_expects() -> None:
    ours, theirs = multiprocessing.Pipe()
    channel = RunnerChannel(ours)
    chunk = TaskChunk(task_id=TaskId("t"), chunk=TokenChunk(text="x" * 300_000))  # more than a pipe holds at once
    reader = threading.Thread(target=lambda: received.append(theirs.recv_bytes()))
    received: list[bytes] = []
    reader.start()
    channel.send(chunk)
    channel.close()
    reader.join(timeout=10)
    assert RunnerResponseAdapter.validate_json(received[0]) == chunk


def test_after_close_a_message_is_written_at_once() -> None:
    ours, theirs = multiprocessing.Pipe()
    channel = RunnerChannel(ours)
    channel.close()
    channel.send(_chunk(7))
    assert theirs.poll(0)
    assert RunnerResponseAdapter.validate_json(theirs.recv_bytes()) == _chunk(7)


def test_poll_sees_a_waiting_message_and_a_closed_pipe() -> None:
    ours, theirs = multiprocessing.Pipe()
    channel = RunnerChannel(ours)
    assert not channel.poll()
    started = time.monotonic()
    assert not channel.poll(0.05)
    assert time.monotonic() - started >= 0.04  # it waited
    theirs.send_bytes(b"{}")
    assert channel.poll()
    ours.recv_bytes()
    assert not channel.poll()
    theirs.close()
    assert channel.poll(1.0)  # a closed pipe reads as ready: the next receive raises EOFError
    with pytest.raises(EOFError):
        channel.receive()
    channel.close()


def test_the_flag_the_decode_loop_reads_rises_for_each_message_and_a_closed_pipe_without_a_poll() -> None:
    """The loop's check each step reads a flag, not the pipe: raised when a message arrives, lowered once `poll`
    finds the pipe empty, raised again by the next message (even one that came while it was being lowered)."""
    ours, theirs = multiprocessing.Pipe()
    channel = RunnerChannel(ours)
    time.sleep(0.05)
    assert not channel.message_waiting()
    for round_ in range(50):
        theirs.send_bytes(b"{}")
        if round_ % 2:
            theirs.send_bytes(b"{}")  # two at once: both read before the flag is lowered
        wait_until(channel.message_waiting, f"the flag to rise in round {round_}", seconds=5.0)
        while channel.poll():
            ours.recv_bytes()
        assert not channel.message_waiting()
    theirs.send_bytes(b"{}")
    wait_until(channel.message_waiting, "the flag to rise", seconds=5.0)
    assert channel.poll()
    ours.recv_bytes()
    assert not channel.poll()
    theirs.close()
    wait_until(channel.message_waiting, "the flag to rise", seconds=5.0)
    assert channel.poll()
    with pytest.raises(EOFError):
        channel.receive()
    channel.close()
