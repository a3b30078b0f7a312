"""One rank of the overlap measurement: `python -m bench.overlap_worker SETUP_JSON`, one JSON line out (rank 0).

Two ranks split the model by layers (rank 1 the first half, rank 0 the rest and the output head) and decode greedy
batches of rows, forward passes only: rank 0 sends each micro-batch's tokens to rank 1 over a TCP connection, rank 1
runs its layers and sends the hidden state on over the mlx.distributed ring, rank 0 runs its layers, picks each row's
token and sends it back. With one micro-batch the ranks take turns; with two, rank 1 runs one micro-batch while rank
0 finishes and samples the other. No all-gather ends a pass (mlx-lm's own pipelines end each with one, which makes
every rank wait for the whole pass), so nothing but the data itself orders the ranks.

The parent starts it with the runner's environment (its BLAS preload) because the ranks must compute as exo's
runners do: the weights go through the runner's CPU preparation (float32 on a Linux CPU).
"""

import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast

import mlx.core as mx
from mlx import nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load_model, load_tokenizer
from pydantic import BaseModel

from bench.results import OverlapRun
from exo.shared.types.worker.shards import PipelinePeers, pipeline_shards
from exo.worker.engines.mlx.cpu.engine import CpuKernels

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a short example."


class OverlapSetup(BaseModel):
    model_path: Path
    rank: int
    peers: PipelinePeers
    configurations: list[tuple[int, int]]
    """(rows, micro-batches) to measure in turn."""
    steps: int
    warmup_steps: int


class OverlapReport(BaseModel):
    runs: list[OverlapRun]


class _Stage:
    """This rank's layers of the model (rank 0: the last ones and the output head)."""

    def __init__(self, setup: OverlapSetup, group: mx.distributed.Group) -> None:
        model, _ = load_model(setup.model_path, lazy=True, strict=False)
        inner = cast(nn.Module, getattr(model, "model"))  # noqa: B009 -- untyped mlx-lm module
        start, end = setup.peers.layer_range(setup.rank)
        inner.layers = cast(list[nn.Module], getattr(inner, "layers"))[start:end]  # noqa: B009
        CpuKernels().prepare_model(model)
        mx.eval(model.parameters())
        self.model, self.inner, self.group, self.rank = model, inner, group, setup.rank
        self.hidden_size = int(getattr(getattr(model, "args"), "hidden_size"))  # noqa: B009

    def caches(self) -> list[KVCache]:
        return [KVCache() for _ in cast(list[nn.Module], getattr(self.inner, "layers"))]  # noqa: B009

    def forward(self, tokens: mx.array, cache: list[KVCache]) -> mx.array:
        """Rank 1: run the first layers and send the hidden state on. Rank 0: receive it, run the rest, return the
        last position's logits."""
        inner = self.inner
        if self.rank == 0:
            shaped = mx.zeros((*tokens.shape, self.hidden_size), dtype=mx.float32)
            hidden = mx.distributed.recv_like(shaped, 1, group=self.group)
        else:
            hidden = cast(nn.Module, getattr(inner, "embed_tokens"))(tokens)  # noqa: B009
        mask = create_attention_mask(hidden, cache[0])
        for layer, layer_cache in zip(cast(list[nn.Module], getattr(inner, "layers")), cache, strict=True):  # noqa: B009
            hidden = layer(hidden, mask, layer_cache)
        if self.rank != 0:
            return mx.distributed.send(hidden, 0, group=self.group)
        hidden = cast(nn.Module, getattr(inner, "norm"))(hidden)  # noqa: B009
        last = hidden[:, -1, :]
        head: object = getattr(self.model, "lm_head", None)
        if head is None:  # tied output head
            return cast(Callable[[mx.array], mx.array], getattr(getattr(inner, "embed_tokens"), "as_linear"))(last)  # noqa: B009
        return cast(nn.Module, head)(last)


def _leader(stage: _Stage, connection: Connection, prompt: list[int], setup: OverlapSetup) -> list[OverlapRun]:
    runs: list[OverlapRun] = []
    for rows, micro_batches in setup.configurations:
        sizes = [rows // micro_batches + (1 if index < rows % micro_batches else 0) for index in range(micro_batches)]
        caches = [stage.caches() for _ in sizes]
        pending = [[prompt] * size for size in sizes]  # each micro-batch's next tokens, per row
        for index in range(micro_batches):
            connection.send((index, pending[index]))
        steps = setup.steps + setup.warmup_steps
        started = 0.0
        for step in range(steps):
            if step == setup.warmup_steps:
                started = time.perf_counter()
            for index in range(micro_batches):
                logits = stage.forward(mx.array(pending[index]), caches[index])
                chosen = cast(list[int], mx.argmax(logits, axis=-1).tolist())
                pending[index] = [[token] for token in chosen]
                if step + 1 < steps:
                    connection.send((index, pending[index]))
        runs.append(
            OverlapRun(
                rows=rows,
                micro_batches=micro_batches,
                tokens=rows * setup.steps,
                wall_s=time.perf_counter() - started,
            )
        )
        connection.send(None)  # the next configuration starts afresh
    return runs


def _follower(stage: _Stage, connection: Connection, setup: OverlapSetup) -> None:
    for _ in setup.configurations:
        caches: dict[int, list[KVCache]] = {}
        while (message := cast(tuple[int, list[list[int]]] | None, connection.recv())) is not None:
            index, tokens = message
            mx.eval(stage.forward(mx.array(tokens), caches.setdefault(index, stage.caches())))


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def main(setup_json: str) -> None:
    from exo.worker.engines.mlx.distributed.ring import join_ring

    setup = OverlapSetup.model_validate_json(setup_json)
    shard = pipeline_shards(setup.peers)[setup.rank]
    listener = socket.create_server(_host_port(setup.peers.task_address)) if setup.rank == 0 else None
    group = join_ring(shard)
    stage = _Stage(setup, group)
    if listener is not None:
        client, _ = listener.accept()
        connection = Connection(client.detach())
        tokenizer = load_tokenizer(setup.model_path)
        prompt = cast(list[int], tokenizer.encode(PROMPT))
        print(OverlapReport(runs=_leader(stage, connection, prompt, setup)).model_dump_json(), flush=True)
    else:
        client = socket.create_connection(_host_port(setup.peers.task_address), timeout=300)
        client.settimeout(None)  # the connection blocks from here on
        connection = Connection(client.detach())
        _follower(stage, connection, setup)


if __name__ == "__main__":
    main(sys.argv[1])
