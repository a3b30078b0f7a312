"""A model split over two nodes (pipeline parallel) with the network between them partitioned, on the rig
(tests/cluster/netns_rig.py).

alpha holds the 4-layer test model (with no end-of-sequence token) and is started with `--min-nodes 2`; beta holds
nothing and copies its layers from alpha. Once the split instance serves, beta's link is cut while a long streamed
request runs on the instance: the stream ends with an error chunk within REQUEST_BOUND_S of the cut, never hangs.
Every request sent to either side during the partition is refused with a clear error within that bound or
answered; a request that reaches alpha while it loads the model alone waits for that load (bounded by
LOADING_BOUND_S here only to catch a hang). alpha, which holds the files, serves the model alone (degraded), and
beta, which holds only its layers, refuses. After healing, the model is split over both nodes again and beta
answers. The times are printed (`-s`) for docs/CLUSTER.md.
"""

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from exo.shared.types.cluster_api import InstanceList, PlacedInstanceView
from tests.cluster.netns_rig import NetnsRig, RigNode, enter_namespace
from tests.fixtures.endless_model import MODEL as ENDLESS
from tests.fixtures.endless_model import endless_copy
from tests.fixtures.fixture_specs import user
from tests.machine_skips import machine_skipif

# tiny-qwen-tools-deep (4 layers, so it can be split) with no end-of-sequence token: its answers last.
MODEL = ENDLESS
CHAT: dict[str, Any] = {"model": MODEL, "messages": [user("Hello!")], "max_tokens": 4}
# Long enough to be still running when the link is cut (a few seconds in).
LONG_CHAT: dict[str, Any] = {"model": MODEL, "messages": [user("Tell me a story.")], "max_tokens": 3000, "stream": True}
REQUEST_BOUND_S = 10.0
# A request that reaches alpha while it loads the model alone waits for that load instead (about 12 s for the test
# model at load 10 here): generous, so that only a hang fails it.
LOADING_BOUND_S = 60.0
START_TIMEOUT_S = 180.0
PARTITION_S = 30.0
HEAL_TIMEOUT_S = 120.0

_WHY_NOT = NetnsRig.unavailable()
pytestmark = machine_skipif(_WHY_NOT)


@pytest.fixture(scope="module")
def split_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsRig]:
    work_dir = tmp_path_factory.mktemp("split")
    rig = NetnsRig(work_dir, "split")
    try:
        rig.create()
        alpha = rig.add_node("alpha", [endless_copy(work_dir, "tiny-qwen-tools-deep")])
        beta = rig.add_node("beta")
        rig.start(alpha, ["--min-nodes", "2"])
        rig.start(beta)
        rig.wait_until(lambda: _serving(rig, alpha, 2) is not None, "the model split over both nodes", START_TIMEOUT_S)
        yield rig
    finally:
        rig.close()


def _serving(rig: NetnsRig, node: RigNode, world_size: int) -> PlacedInstanceView | None:
    """The instance of the model that is ready over `world_size` nodes, as `node` sees it."""
    instances = InstanceList.model_validate(rig.get(node, "/v1/cluster/instances", timeout=5)).data
    ready = [item for item in instances if item.ready and item.world_size == world_size]
    return ready[0] if len(ready) == 1 else None


def _ask(rig: NetnsRig, node: RigNode) -> tuple[int, float]:
    """One request: refused with an error message within the bound, or answered (after waiting, at most, for a
    survivor to load the model alone). Returns its status and how long it took."""
    started = time.monotonic()
    try:
        response = rig.post(node, "/v1/chat/completions", CHAT, timeout=LOADING_BOUND_S + 5)
    except httpx.HTTPError as error:
        raise AssertionError(f"{node.name}: no answer within {LOADING_BOUND_S + 5} s: {error!r}") from error
    took = time.monotonic() - started
    if response.status_code != 200:
        assert response.json()["error"]["message"], response.text
        assert took <= REQUEST_BOUND_S, (node.name, response.status_code, took)
    assert took <= LOADING_BOUND_S, (node.name, response.status_code, took)
    return response.status_code, took


@dataclass
class Stream:
    """A streamed request read in a thread inside a node's namespace: when each event came, and how it ended."""

    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list[tuple[float, dict[str, Any]]])
    ended_at: float | None = None
    failure: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def read(self, node: RigNode) -> None:
        enter_namespace(node.namespace)
        try:
            # The read timeout is far past the bound: a stream that hangs is seen as one, not cut short by httpx.
            with httpx.stream("POST", f"{node.base_url}/v1/chat/completions", json=LONG_CHAT, timeout=60) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data: {"):
                        self.events.append((time.monotonic(), json.loads(line.removeprefix("data: "))))
        except httpx.HTTPError as error:
            self.failure = repr(error)
        finally:
            self.ended_at = time.monotonic()
            self.done.set()


def test_a_partition_across_a_split_instance_fails_fast_then_heals(split_rig: NetnsRig) -> None:
    rig = split_rig
    alpha, beta = rig.nodes
    stream = Stream()
    threading.Thread(target=stream.read, args=(alpha,), daemon=True).start()
    rig.wait_until(lambda: len(stream.events) >= 5, "the long request streaming", 30)
    rig.cut(beta)
    cut_at = time.monotonic()
    try:
        assert stream.done.wait(REQUEST_BOUND_S + 20), "the stream across the cut link hung"
        assert stream.ended_at is not None
        assert stream.failure is None, stream.failure  # it ended with an answer of its own, not a client timeout
        stream_ended = stream.ended_at - cut_at
        last = stream.events[-1][1]
        assert stream_ended <= REQUEST_BOUND_S
        assert "error" in last, last  # 3000 tokens could not have finished in the bound: it says why it stopped
        assert last["error"]["message"]

        # (seconds after the cut when it ended, status, seconds it took), per node
        outcomes: dict[str, list[tuple[float, int, float]]] = {alpha.name: [], beta.name: []}
        while time.monotonic() - cut_at < PARTITION_S:
            for node in (alpha, beta):
                status, took = _ask(rig, node)
                outcomes[node.name].append((time.monotonic() - cut_at, status, took))
            time.sleep(0.5)
        served_alone = next(at for at, status, _ in outcomes[alpha.name] if status == 200)
        assert all(status == 200 for at, status, _ in outcomes[alpha.name] if at > served_alone)
        assert all(status != 200 for _, status, _ in outcomes[beta.name])  # cut off with only its layers
        longest_wait = max(took for _, status, took in outcomes[alpha.name] if status == 200)
        alone = _serving(rig, alpha, 1)
        assert alone is not None
        assert alone.degraded
    finally:
        rig.heal(beta)
    healed_at = time.monotonic()
    rig.wait_until(lambda: _serving(rig, alpha, 2) is not None, "the model split again after healing", HEAL_TIMEOUT_S)
    split_again = time.monotonic() - healed_at
    again = _serving(rig, alpha, 2)
    assert again is not None
    assert not again.degraded
    rig.wait_until(lambda: _ask(rig, beta)[0] == 200, "beta answering again", 30)
    print(
        f"split instance across a partition: the stream in flight ended {stream_ended:.1f} s after the cut; alpha "
        f"served alone {served_alone:.1f} s after it (the longest answered request waited {longest_wait:.1f} s); "
        f"beta refused every request ({len(outcomes[beta.name])}); "
        f"split again {split_again:.1f} s after healing"
    )
