"""Large bodies at once: the node's memory stays within a multiple of the body limit, and goes back down.

Six clients each send a chat request of about 30 MB at the same moment to a real node. A `refused` body is parsed
and validated, then refused for its last field (nothing reaches the master); a `served` one is submitted, and the
runner refuses it as longer than the context after the command crossed the bus to it. The process's peak RSS (the
kernel's high-water mark) may grow by at most `peak` body limits over its size before, and once the answers are in
its RSS must come back within `settled` limits. Measured with bench/large_bodies.py (2-core shared Linux machine,
load 4-5) before the body budget (commit 20cabc2): refused 164 → 482 MiB peak, 391 settled; served 391 → 1,140
peak, 1,020 settled. With it: refused +94 MiB peak, +0 settled; served 163 → 373 peak, 184 settled.
"""

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.exo_server import ExoServer, fixture_model, running_exo

MODEL = "tiny-qwen-tools"
BODY_LIMIT_MIB = 32
CLIENTS = 6

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")]


def mib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0]) // 1024
    raise AssertionError(f"{field} not in /proc/{pid}/status")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(MODEL)], tmp_path_factory.mktemp("exo-large-bodies")) as running:
        warm = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 2}
        assert httpx.post(f"{running.base_url}/v1/chat/completions", json=warm, timeout=120).status_code == 200
        yield running


def large_body(kind: str) -> bytes:
    text = "hello world " * (30 * 1024 * 1024 // 12)
    request: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    if kind == "refused":
        request["temperature"] = "hot"
    return json.dumps(request).encode()


@pytest.mark.parametrize(("kind", "peak", "settled"), [("refused", 5, 1), ("served", 10, 2)])
def test_six_30_mb_bodies_at_once_stay_within_body_limits_and_memory_returns(
    server: ExoServer, kind: str, peak: int, settled: int
) -> None:
    body = large_body(kind)
    pid = server.process.pid
    before = mib(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets the high-water mark to the current RSS
    statuses: list[int] = []

    def send() -> None:
        headers = {"Content-Type": "application/json"}
        response = httpx.post(f"{server.base_url}/v1/chat/completions", content=body, headers=headers, timeout=600)
        statuses.append(response.status_code)

    threads = [threading.Thread(target=send) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    highest = mib(pid, "VmHWM")
    # Every body was read and refused with a 4xx in the end, none lost to a 5xx.
    assert len(statuses) == CLIENTS
    assert all(400 <= status < 500 for status in statuses), statuses
    assert highest - before <= peak * BODY_LIMIT_MIB, (before, highest)
    now = mib(pid, "VmRSS")
    deadline = time.monotonic() + 10
    while now - before > settled * BODY_LIMIT_MIB and time.monotonic() < deadline:
        time.sleep(0.5)
        now = mib(pid, "VmRSS")
    assert now - before <= settled * BODY_LIMIT_MIB, (before, highest, now)
    hello = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 2}
    assert httpx.post(f"{server.base_url}/v1/chat/completions", json=hello, timeout=120).status_code == 200
