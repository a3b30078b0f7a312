"""Two real nodes on 127.0.0.1 measure the round trip and bandwidth between them over the cluster's transport and
their memory bandwidth, publish them in /state, and an `auto` placement over both weighs the split by those figures.

alpha serves tiny-qwen-tools-deep whole; beta (`--no-model`) joins it. Once each node's facts carry a measured round
trip to the other, alpha is asked to place the model over 2 nodes with `parallel: auto`: the instance's
`parallel_reason` names the estimate of each split with the round trip the nodes measured and its transfer over the
bandwidth they measured, and the split it names serves.

A model placed at start (`--min-nodes 2`) is asked for the moment the second node is up, before either node's
figures reach the master: the master holds it for them, settled after the join (master/placement_hold.py), so it
too is weighed by the measured round trip and bandwidth rather than split by layers.
"""

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from exo.master.split_choice import format_ms
from exo.master.split_estimates import MIN_TIMED_STEPS
from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.exo_server import fixture_model

DEEP = "tiny-qwen-tools-deep"
MEASURED_WITHIN_S = 60.0
PLACED_WITHIN_S = 240.0
# The transfer term: counted over the measured bandwidth, or (a bandwidth not measured yet) not counted.
TRANSFER = (
    r"(?: \+ (?P<{0}>[\d.]+) KiB at [\d.]+ MB/s = [\d.]+ ms transfer"
    r"|; transfer of (?P<{0}_uncounted>[\d.]+) KiB not counted: link bandwidth not measured)"
)
# Where a node's runner timed decode steps of the model served whole, that rank's compute is the timed step.
TIMED = r"(?P<{0}> \(1 of 2 ranks from a timed decode step, the rest bytes over memory bandwidth × [\d.]+ as timed\))?"
REASON = re.compile(
    r"auto: (?P<chosen>pipeline|tensor) over 2 nodes est\. [\d.]+ ms/token \(compute [\d.]+"
    + TIMED.format("chosen_timed")
    + r" \+ (?P<exchanges>\d+) × "
    r"(?P<trip>[\d.]+) ms round trip" + TRANSFER.format("chosen_kib") + r"\) against (?P<other>pipeline|tensor) over "
    r"2 nodes est\. [\d.]+ ms/token \(compute [\d.]+"
    + TIMED.format("other_timed")
    + r" \+ \d+ × (?P=trip) ms round trip"
    + TRANSFER.format("other_kib")
    + r"\)"
)
# hidden size 64, 4 layers: a tensor split's all-sums carry 2 × 4 × 64 × 4 bytes a token and rank 0's 256-byte step
# message (2.2 KiB), a pipeline's hop one 256-byte hidden state and the step message (0.5 KiB).
TRANSFER_KIB = {"tensor": "2.2", "pipeline": "0.5"}


def transfer_counted(match: re.Match[str]) -> bool:
    """Each split's transfer in the reason is the bytes it sends a token (the link's bandwidth was measured)."""
    return (match["chosen_kib"], match["other_kib"]) == (TRANSFER_KIB[match["chosen"]], TRANSFER_KIB[match["other"]])


def measured(state: dict[str, Any], node: str, peer: str) -> dict[str, Any] | None:
    facts = state["nodes"][node]["facts"]
    links: dict[str, dict[str, Any]] = facts["links"]
    link = links.get(peer)
    measured_all = facts["memory_bandwidth_bytes_per_second"] and link and link.get("bandwidth_bytes_per_second")
    return link if measured_all else None


def pair_round_trip(state: dict[str, Any], alpha: str, beta: str) -> str:
    """The round trip placement weighs, as the reason prints it: the slower of the two nodes' measurements."""
    trips = [link["round_trip_ms"] for link in (measured(state, alpha, beta), measured(state, beta, alpha)) if link]
    return format_ms(max(trips))


def test_a_model_placed_at_start_over_two_nodes_waits_for_the_figures_and_is_weighed_by_them(
    tmp_path: Path,
) -> None:
    with local_cluster(tmp_path, "link-auto-start") as cluster:
        alpha, _beta = cluster.launch_split(fixture_model(DEEP))
        launched = time.monotonic()
        instance = cluster.wait_serving(alpha, 2, "the model placed at start over both nodes", PLACED_WITHIN_S)
        reason = instance.parallel_reason or ""
        print(f"parallel_reason: {reason} (serving {time.monotonic() - launched:.1f} s after the nodes launched)")
        match = REASON.fullmatch(reason)
        assert match is not None, reason  # weighed by the measured figures, not "auto: by layers (not measured yet"
        assert instance.parallel == match["chosen"]
        # The hold waits for the link's figures to settle after the join: each node times the bandwidth in the round
        # at join and again in the settling rounds 1 and 3 s later, so the placement weighs a measured bandwidth
        # (at join alone a busy moment could leave a node without one until its next round, 15 s later).
        assert transfer_counted(match), reason
        # 4 layers: a tensor split waits for 9 exchanges a token, a pipeline for 3.
        assert int(match["exchanges"]) == (9 if match["chosen"] == "tensor" else 3)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ClusterNode, ClusterNode]]:
    with local_cluster(tmp_path_factory.mktemp("link-auto"), "link-auto") as running:
        alpha = running.start("alpha", [fixture_model(DEEP)])
        beta = running.start("beta", peers=[alpha])

        def both_measured() -> bool:
            state = alpha.state()
            ids = (alpha.node_id, beta.node_id)
            return all(
                node in state["nodes"] and measured(state, node, peer) is not None for node, peer in (ids, ids[::-1])
            )

        running.wait_until(alpha, both_measured, "each node's measured round trip to the other", MEASURED_WITHIN_S)
        yield running, alpha, beta


def test_each_node_publishes_its_measured_round_trip_to_the_other(
    pair: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    _cluster, alpha, beta = pair
    state = alpha.state()
    for node, peer in ((alpha.node_id, beta.node_id), (beta.node_id, alpha.node_id)):
        facts = state["nodes"][node]["facts"]
        link = facts["links"][peer]
        # A zenoh query and its reply between two processes on one machine: more than nothing, far under the 2 s
        # the probe waits.
        assert 0 < link["round_trip_ms"] < 2000
        assert 1 <= link["samples"] <= 5
        assert link["measured_at"] > 0
        # 256 KiB more in the bulk probe's reply took longer than the small one's: a figure, and a positive one.
        assert link["bandwidth_bytes_per_second"] > 0
        # At least 100 MB/s: a node that copied memory at all (any machine reaches gigabytes per second).
        assert facts["memory_bandwidth_bytes_per_second"] > 1e8
        assert list(facts["links"]) == [peer]


def decode_alone(node: ClusterNode, max_tokens: int) -> None:
    body: dict[str, Any] = {
        "model": DEEP,
        "messages": [{"role": "user", "content": "Count from one to one hundred."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    httpx.post(f"{node.base_url}/v1/chat/completions", json=body, timeout=120).raise_for_status()


def steps_timed_alone(node: ClusterNode) -> int:
    """Decode steps with one request decoding that `node`'s runners timed, as /state shows them."""
    runners: dict[str, dict[str, Any]] = node.state()["runners"]
    return sum(
        runner["step_times"].get("1", {}).get("steps", 0)
        for runner in runners.values()
        if runner["node_id"] == node.node_id
    )


def test_an_auto_placement_weighs_the_splits_by_the_measured_round_trip_and_serves_its_choice(
    pair: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    cluster, alpha, beta = pair
    # alpha serves the model whole: a request decoded alone times its steps, which become alpha's rank's compute.
    for _ in range(3):
        if steps_timed_alone(alpha) >= MIN_TIMED_STEPS:
            break
        decode_alone(alpha, 48)
        time.sleep(1.0)  # the runner's totals reach /state with the node's next report
    assert steps_timed_alone(alpha) >= MIN_TIMED_STEPS
    before = pair_round_trip(alpha.state(), alpha.node_id, beta.node_id)
    body = {"model": str(fixture_model(DEEP)), "min_nodes": 2, "parallel": "auto"}
    response = httpx.post(f"{alpha.base_url}/v1/cluster/instances", json=body, timeout=60)
    after = pair_round_trip(alpha.state(), alpha.node_id, beta.node_id)
    assert response.status_code == 200, response.text
    placed = response.json()
    reason = placed["parallel_reason"]
    print(f"parallel_reason: {reason}")  # the figures of this run, for the record (pytest -s)
    match = REASON.fullmatch(reason)
    assert match is not None, reason
    # The figure the nodes published (it may have been measured again while the placement ran).
    assert match["trip"] in {before, after}, (reason, before, after)
    # 4 layers: a tensor split waits for 9 exchanges a token, a pipeline for 3.
    assert int(match["exchanges"]) == (9 if match["chosen"] == "tensor" else 3)
    assert {match["chosen"], match["other"]} == {"pipeline", "tensor"}
    assert transfer_counted(match), reason
    # beta serves nothing: its rank's compute is its bytes over its memory bandwidth, scaled as alpha's step was.
    assert match["chosen_timed"], reason
    assert match["other_timed"], reason
    assert placed["parallel"] == match["chosen"]
    instance = cluster.wait_serving(beta, 2, f"the {match['chosen']} split auto chose", PLACED_WITHIN_S)
    assert (instance.parallel, instance.parallel_reason) == (match["chosen"], reason)
