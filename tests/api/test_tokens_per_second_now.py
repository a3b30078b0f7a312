""" "Tokens per second now" while requests decode, on a real node: two streams of a model that never ends its
answers decode side by side, and before either ends the node's metrics already show a rate above zero (tokens are
counted as they are produced, not when a request ends)."""

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.exo_server import ExoServer, running_exo
from tests.fixtures.endless_model import MODEL, endless_copy
from tests.fixtures.fixture_specs import user

STREAMS = 2
# Far more than a fast machine decodes while the test looks; the streams are closed once it has looked.
MAX_TOKENS = 60_000
CONTEXT = 65_536
RATE_SEEN_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    models = tmp_path_factory.mktemp("endless")
    with running_exo([endless_copy(models, context_length=CONTEXT)], tmp_path_factory.mktemp("rate")) as running:
        yield running


def _stream_until_stopped(base_url: str, decoding: threading.Semaphore, stop: threading.Event) -> None:
    body = {"model": MODEL, "messages": [user("Tell me a long story.")], "max_tokens": MAX_TOKENS, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        seen = 0
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                seen += 1
                if seen == 5:
                    decoding.release()
            if stop.is_set():
                return


@pytest.mark.slow
def test_the_rate_counts_tokens_while_requests_decode(server: ExoServer) -> None:
    decoding = threading.Semaphore(0)
    stop = threading.Event()
    streams = [
        threading.Thread(target=_stream_until_stopped, args=(server.base_url, decoding, stop)) for _ in range(STREAMS)
    ]
    for stream in streams:
        stream.start()
    try:
        for _ in range(STREAMS):
            assert decoding.acquire(timeout=120), "a stream never started decoding"
        deadline = time.monotonic() + RATE_SEEN_WITHIN_S
        metrics: dict[str, object] = {}
        while time.monotonic() < deadline:
            metrics = httpx.get(f"{server.base_url}/v1/cluster/metrics", timeout=10).json()["nodes"][0]
            if float(str(metrics.get("tokens_per_second_now", 0))) > 0:
                break
            time.sleep(0.2)
        assert float(str(metrics.get("tokens_per_second_now", 0))) > 0, metrics
        assert metrics["requests_finished"] == 0  # neither request has ended: the rate did not wait for one
        assert metrics["tasks_running"] == STREAMS
        state = httpx.get(f"{server.base_url}/state", timeout=10).json()
        (runner,) = state["runners"].values()
        assert runner["tokens_per_second_now"] > 0
    finally:
        stop.set()
        for stream in streams:
            stream.join(timeout=120)
