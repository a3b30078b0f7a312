"""Capture the bytes a tensor split's ranks send per decoded token and compare them with the figure `auto` computes
(master/split_choice.py tensor_transfer_bytes). Not a test: a measurement, run by hand.

Two real nodes on 127.0.0.1 (tests/cluster/local_cluster.py `launch_split`) split the 4-layer test model by matrices.
Before and after each of two greedy requests with the same prompt and different lengths, `ss -tinp` reads
`bytes_sent` of every TCP socket the two runner processes hold (the ring and the task connections; a runner talks to
its node over a pipe, not TCP). The difference between the two requests' bytes over the difference in their decoded
tokens is the bytes per decoded token: the prompt's prefill and each request's fixed messages cancel.

    uv run python -m tests.cluster.capture_allsum_bytes
"""

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import psutil

from exo.master.split_choice import tensor_transfer_bytes
from exo.models.footprint import read_footprint
from tests.cluster.local_cluster import local_cluster
from tests.exo_server import fixture_model

DEEP = "tiny-qwen-tools-deep"
LENGTHS = (8, 72)
SOCKET = re.compile(
    r"^\S+\s+\d+\s+\d+\s+(?P<local>\S+)\s+(?P<peer>\S+)"
    r".*?users:\(\(\"[^\"]*\",pid=(?P<pid>\d+),fd=\d+\)\).*?bytes_sent:(?P<sent>\d+)",
    re.DOTALL,
)


def runner_pids(node_pids: list[int]) -> set[int]:
    return {child.pid for pid in node_pids for child in psutil.Process(pid).children(recursive=True)}


def bytes_sent(pids: set[int]) -> dict[str, int]:
    """The bytes each TCP socket of `pids` has sent so far, by "pid local -> peer" (ss prints each socket's
    addresses and owner, then its counters on the next line)."""
    listing = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    sent: dict[str, int] = {}
    for entry in re.split(r"\n(?=\S)", listing):
        match = SOCKET.search(entry)
        if match is not None and int(match["pid"]) in pids:
            sent[f"{match['pid']} {match['local']} -> {match['peer']}"] = int(match["sent"])
    return sent


def sent_since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {socket: after[socket] - before.get(socket, 0) for socket in after}


def decode(base_url: str, max_tokens: int) -> int:
    body: dict[str, Any] = {
        "model": DEEP,
        "messages": [{"role": "user", "content": "Count from one to one hundred."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def main() -> None:
    footprint = read_footprint(fixture_model(DEEP))
    assert footprint.hidden_size is not None
    computed = tensor_transfer_bytes(footprint.num_layers, footprint.hidden_size, 2)
    with tempfile.TemporaryDirectory() as work, local_cluster(Path(work), "allsum-bytes") as cluster:
        alpha, beta = cluster.launch_split(fixture_model(DEEP), "tensor")
        cluster.wait_serving(alpha, 2, "the tensor split", 240)
        pids = runner_pids([alpha.process.pid, beta.process.pid])
        decode(alpha.base_url, 4)  # warm-up
        measured: list[tuple[int, dict[str, int]]] = []
        for length in LENGTHS:
            before = bytes_sent(pids)
            tokens = decode(alpha.base_url, length)
            measured.append((tokens, sent_since(before, bytes_sent(pids))))
            print(f"max_tokens {length}: {tokens} tokens decoded, {sum(measured[-1][1].values())} bytes sent")
        (short_tokens, short), (long_tokens, long) = measured
        decoded = long_tokens - short_tokens
        for socket in sorted(long):
            print(f"  {socket}: {(long[socket] - short.get(socket, 0)) / decoded:.0f} bytes per decoded token")
        per_token = (sum(long.values()) - sum(short.values())) / decoded
        print(f"runner pids {sorted(pids)}; layers {footprint.num_layers}, hidden size {footprint.hidden_size}")
        print(f"captured: {per_token:.0f} bytes per decoded token by both ranks, {per_token / 2:.0f} per rank")
        print(f"computed (tensor_transfer_bytes, per rank): {computed}")


if __name__ == "__main__":
    main()
