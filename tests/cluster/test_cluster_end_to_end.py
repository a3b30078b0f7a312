"""Three real nodes on 127.0.0.1 joined by explicit peers, sharing one state and serving each other's models.

alpha serves tiny-qwen-tools and endless-qwen (a copy that never stops generating, for the cancellation test), gamma
serves tiny-llama31-tools, beta serves nothing (`--no-model`). beta dials alpha
and gamma dials beta, so alpha and gamma reach each other only through zenoh's gossip. The tests here leave the
membership as it is; the ones that crash, freeze or restart nodes are in test_cluster_failover.py.
"""

import functools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zenoh

from exo.shared.types.cluster_api import ClusterMetrics, ClusterNodeList, ClusterSummary
from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.exo_server import fixture_model
from tests.fixtures.endless_model import MODEL as ENDLESS_MODEL
from tests.fixtures.endless_model import endless_copy
from tests.fixtures.fixture_specs import GET_TIME_TOOL, GET_WEATHER_TOOL, GREETING_REPLY, user

QWEN = "tiny-qwen-tools"
LLAMA = "tiny-llama31-tools"
CLUSTER = "e2e-three"
# The endless model's context: room for a request that no machine finishes within the cancellation test's window.
ENDLESS_CONTEXT = 65_536


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    endless = endless_copy(tmp_path_factory.mktemp("models"), context_length=ENDLESS_CONTEXT)
    with local_cluster(tmp_path_factory.mktemp("cluster"), CLUSTER) as running:
        alpha = running.start("alpha", [fixture_model(QWEN), endless])  # first, so it is the master
        beta = running.launch("beta", peers=[alpha])
        gamma = running.launch("gamma", [fixture_model(LLAMA)], peers=[beta])
        running.wait_ready(beta)
        running.wait_ready(gamma)
        yield running


def node(cluster: LocalCluster, name: str) -> ClusterNode:
    return next(candidate for candidate in cluster.nodes if candidate.name == name)


def post(target: ClusterNode, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{target.base_url}/v1/chat/completions", json=body, timeout=120)


def stream_events(target: ClusterNode, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """(HTTP status, decoded SSE payloads with `[DONE]` kept as the string)."""
    response = post(target, {**body, "stream": True, "stream_options": {"include_usage": True}})
    if response.status_code != 200:
        return response.status_code, [response.json()]
    payloads = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    return 200, [payload if payload == "[DONE]" else json.loads(payload) for payload in payloads]


def comparable(events: list[Any]) -> list[Any]:
    """The events without what differs between any two responses: completion id, timestamp, tool-call ids."""
    result: list[Any] = []
    for event in events:
        if not isinstance(event, dict):
            result.append(event)
            continue
        kept: dict[str, Any] = {key: value for key, value in event.items() if key not in ("id", "created")}  # pyright: ignore[reportUnknownVariableType]
        for choice in kept.get("choices", []):
            for call in choice["delta"].get("tool_calls", []):
                if "id" in call:
                    call["id"] = "call_*"
        result.append(kept)
    return result


def test_every_node_converges_on_one_state_with_one_master(cluster: LocalCluster) -> None:
    state = cluster.settled_states(cluster.nodes)
    ids = {member.node_id for member in cluster.nodes}
    assert set(state["nodes"]) == ids
    assert state["master_node_id"] == node(cluster, "alpha").node_id  # the longest-running node
    for info in state["nodes"].values():
        assert info["health"] == {"status": "healthy", "reason": None}
    by_name = {info["facts"]["name"]: info["facts"] for info in state["nodes"].values()}
    assert by_name["beta"]["serves_models"] is False
    assert by_name["alpha"]["cluster_endpoints"] == [node(cluster, "alpha").endpoint]
    assert by_name["alpha"]["memory"]["total_bytes"] >= by_name["alpha"]["memory"]["available_bytes"] > 0
    assert by_name["alpha"]["mlx_backend"] == "cpu"
    runners = {runner["model_id"]: runner["node_id"] for runner in state["runners"].values()}
    alpha_id, gamma_id = node(cluster, "alpha").node_id, node(cluster, "gamma").node_id
    assert runners == {QWEN: alpha_id, ENDLESS_MODEL: alpha_id, LLAMA: gamma_id}


def test_every_node_lists_every_model(cluster: LocalCluster) -> None:
    for member in cluster.nodes:
        cards = member.get("/v1/models")["data"]
        assert sorted(card["id"] for card in cards) == sorted([QWEN, LLAMA, ENDLESS_MODEL]), member.name
        assert all("tool_use" in card["capabilities"] for card in cards)


@pytest.mark.parametrize(
    ("owner", "elsewhere", "body"),
    [
        ("alpha", "beta", {"model": QWEN, "messages": [user("What is the weather in Paris and Tokyo?")]}),
        ("gamma", "alpha", {"model": LLAMA, "messages": [user("What time is it in Tokyo?")]}),
    ],
)
def test_a_forwarded_stream_carries_the_same_chunks_tool_calls_and_usage(
    cluster: LocalCluster, owner: str, elsewhere: str, body: dict[str, Any]
) -> None:
    body = {**body, "tools": [GET_WEATHER_TOOL, GET_TIME_TOOL] if body["model"] == LLAMA else [GET_WEATHER_TOOL]}
    # Once first, so the prompt is in the owner's prefix cache for both compared requests (usage reports it).
    stream_events(node(cluster, owner), body)
    forwarded_status, forwarded = stream_events(node(cluster, elsewhere), body)
    direct_status, direct = stream_events(node(cluster, owner), body)
    assert direct_status == forwarded_status == 200
    assert any(choice["delta"].get("tool_calls") for event in direct[:-1] for choice in event["choices"])
    assert direct[-2]["usage"]["completion_tokens"] > 0
    assert comparable(forwarded) == comparable(direct)


def test_a_forwarded_completion_is_the_same_answer(cluster: LocalCluster) -> None:
    body = {"model": QWEN, "messages": [user("Hello!")], "stop": ["<|im_end|>"]}
    post(node(cluster, "alpha"), body)  # warms the prefix cache, as above
    forwarded, direct = post(node(cluster, "gamma"), body), post(node(cluster, "alpha"), body)
    assert direct.status_code == forwarded.status_code == 200
    assert forwarded.json()["choices"] == direct.json()["choices"]
    assert forwarded.json()["usage"] == direct.json()["usage"]
    assert forwarded.json()["choices"][0]["message"]["content"] == GREETING_REPLY


def test_a_request_error_from_the_owning_node_reaches_the_client_unchanged(cluster: LocalCluster) -> None:
    too_long = {"model": QWEN, "messages": [user("word " * 6000)]}
    for stream in (False, True):
        direct = post(node(cluster, "alpha"), {**too_long, "stream": stream})
        forwarded = post(node(cluster, "beta"), {**too_long, "stream": stream})
        assert direct.status_code == forwarded.status_code == 400
        assert forwarded.json() == direct.json()
        assert forwarded.json()["error"]["code"] == "context_length_exceeded"


def test_every_node_lists_how_the_requests_a_node_took_ended_without_their_text(cluster: LocalCluster) -> None:
    alpha, gamma = node(cluster, "alpha"), node(cluster, "gamma")
    secret = "Say hello to the lighthouse keeper 7f3a."
    # gamma's API takes a Messages request for alpha's model, and a streamed chat completion that alpha refuses.
    answered = httpx.post(
        f"{gamma.base_url}/v1/messages",
        json={"model": QWEN, "max_tokens": 8, "messages": [{"role": "user", "content": secret}]},
        timeout=120,
    )
    assert answered.status_code == 200, answered.text
    refused = post(gamma, {"model": QWEN, "messages": [user("word " * 6000)], "stream": True})
    assert refused.status_code == 400

    def newest(member: ClusterNode, dialect: str) -> dict[str, Any] | None:
        taken = member.state()["nodes"][gamma.node_id]["recent_requests"]
        return next((record for record in reversed(taken) if record["dialect"] == dialect), None)

    def refusal_listed(member: ClusterNode) -> bool:
        return (newest(member, "chat.completions") or {}).get("outcome") == "failed"

    for member in cluster.nodes:
        cluster.wait_until(member, functools.partial(refusal_listed, member), "both requests", 10)
        finished, failed = newest(member, "messages"), newest(member, "chat.completions")
        assert finished is not None
        assert failed is not None
        usage = answered.json()["usage"]
        assert (finished["model_id"], finished["served_by"], finished["outcome"]) == (QWEN, alpha.node_id, "finished")
        assert finished["finish_reason"] in ("stop", "length")
        assert finished["prompt_tokens"] == usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
        assert finished["completion_tokens"] == usage["output_tokens"]
        assert 0 < finished["time_to_first_token_seconds"] < 120
        assert finished["error"] is None
        assert (failed["served_by"], failed["error_kind"]) == (alpha.node_id, "context_length_exceeded")
        assert failed["error"]
        assert failed["time_to_first_token_seconds"] is None
        # The cluster keeps counts and times, never the prompt.
        assert secret not in json.dumps(member.state())


def test_an_unknown_model_is_a_404_naming_the_cluster_models(cluster: LocalCluster) -> None:
    response = post(node(cluster, "beta"), {"model": "nope", "messages": [user("Hello!")]})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    for model in (QWEN, LLAMA, ENDLESS_MODEL):
        assert model in response.json()["error"]["message"]


def test_a_disconnect_on_the_forwarding_node_cancels_generation_on_the_owning_node(cluster: LocalCluster) -> None:
    alpha, beta = node(cluster, "alpha"), node(cluster, "beta")
    # The fixture generates thousands of tokens a second, and on a busy 2-core machine the chunks already queued
    # between alpha's runner and the client can be seconds' worth: the cancellation must be judged by its outcome
    # and by time, not by a token count tuned to one machine's speed.
    max_tokens = ENDLESS_CONTEXT - 1024
    body = {
        "model": ENDLESS_MODEL,
        "messages": [user("Tell me a long story.")],
        "max_tokens": max_tokens,
        "stream": True,
    }
    with httpx.stream("POST", f"{beta.base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # generation is under way on alpha
        left_at = time.monotonic()
    # The task ends on alpha as cancelled (not finished at max_tokens), within seconds of the client leaving.
    summary: dict[str, Any] = {}

    def cancelled_on_alpha() -> bool:
        nonlocal summary
        (runner,) = [runner for runner in alpha.state()["runners"].values() if runner["model_id"] == ENDLESS_MODEL]
        summary = runner["recent_tasks"][-1] if runner["recent_tasks"] else {}
        return summary.get("outcome") == "cancelled"

    cluster.wait_until(alpha, cancelled_on_alpha, "the task to be cancelled on alpha", 30)
    assert time.monotonic() - left_at < 30
    assert summary["generated_tokens"] < max_tokens // 2
    assert not alpha.state()["tasks"]


def test_the_cluster_endpoints_agree_across_nodes_and_count_served_requests(cluster: LocalCluster) -> None:
    post(node(cluster, "beta"), {"model": LLAMA, "messages": [user("Hello!")], "max_tokens": 8})
    for member in cluster.nodes:  # each node's summary names the node that answered
        assert ClusterSummary.model_validate(member.get("/v1/cluster")).node_id == member.node_id
    # Apart from that, every node gives the same summary (judged on one round of reads, as resources keep moving).
    agreed = cluster.agreed(
        cluster.nodes,
        lambda member: ClusterSummary.model_validate(member.get("/v1/cluster")).model_copy(update={"node_id": ""}),
        "/v1/cluster",
    )
    assert (agreed.cluster, agreed.nodes_healthy, agreed.nodes_down) == (CLUSTER, 3, 0)
    assert [model.model_id for model in agreed.models] == sorted([QWEN, LLAMA, ENDLESS_MODEL])
    nodes = ClusterNodeList.model_validate(node(cluster, "gamma").get("/v1/cluster/nodes"))
    assert sorted(entry.name for entry in nodes.data) == ["alpha", "beta", "gamma"]
    gamma_id = node(cluster, "gamma").node_id
    assert node(cluster, "alpha").get(f"/v1/cluster/nodes/{gamma_id}")["models"][0]["model_id"] == LLAMA
    metrics = ClusterMetrics.model_validate(node(cluster, "alpha").get("/v1/cluster/metrics"))
    llama = next(model for model in metrics.models if model.model_id == LLAMA)
    assert llama.node_ids == [gamma_id]
    assert llama.requests_finished >= 1
    assert llama.time_to_first_token_seconds is not None
    prometheus = httpx.get(f"{node(cluster, 'beta').base_url}/metrics", timeout=10).text
    assert f'exo_node_up{{cluster="{CLUSTER}",node_id="{gamma_id}",node_name="gamma"}} 1.0' in prometheus


def test_malformed_and_foreign_messages_are_dropped_and_the_cluster_keeps_serving(cluster: LocalCluster) -> None:
    alpha, beta = node(cluster, "alpha"), node(cluster, "beta")
    before = cluster.settled_states(cluster.nodes)
    root = f"exo/{CLUSTER}/v1"
    forged_runner = {
        "runner_id": "forged",
        "node_id": alpha.node_id,
        "instance_id": "forged",
        "model_id": "forged-model",
        "model_path": "/forged",
        "shard": {"rank": 0, "world_size": 1, "start_layer": 0, "end_layer": None},
        "status": "ready",
    }
    garbage: list[tuple[str, bytes]] = [
        (f"{root}/events/local", b"\x00\xff not json"),
        (f"{root}/events/ordered", b'{"kind": "indexed_event", "index": "many"}'),
        (f"{root}/master/commands", b'{"kind": "place_task"}'),
        (f"{root}/workers/{alpha.node_id}", b'{"kind": "assign_task", "task": 1}'),
        (f"{root}/replies/{beta.node_id}", b"[]"),
        (f"{root}/resync", b'{"kind": "resync_request", "leader": 5}'),
        # Well-formed but foreign: beta claiming alpha's runner, and an event log entry from a node that is not master.
        (
            f"{root}/events/local",
            json.dumps(
                {
                    "kind": "local_event",
                    "origin": beta.node_id,
                    "sequence": 1,
                    "event": {"kind": "runner_updated", "runner": forged_runner},
                }
            ).encode(),
        ),
        (
            f"{root}/events/ordered",
            json.dumps(
                {
                    "kind": "indexed_event",
                    "leader": beta.node_id,
                    "index": before["last_event_index"] + 1,
                    "ordered_at": 0.0,
                    "origin": beta.node_id,
                    "event": {"kind": "master_elected", "node_id": beta.node_id},
                }
            ).encode(),
        ),
    ]
    config = zenoh.Config()
    config.insert_json5("mode", '"peer"')
    config.insert_json5("listen/endpoints", "[]")
    config.insert_json5("connect/endpoints", json.dumps([alpha.endpoint, beta.endpoint]))
    config.insert_json5("scouting/multicast/enabled", "false")
    with zenoh.open(config) as intruder:
        deadline = time.monotonic() + 20
        while len(intruder.info.peers_zid()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # let subscriptions propagate to the new session
        for key, payload in garbage:
            intruder.put(key, payload)
        time.sleep(1.0)
    for member in (alpha, beta):
        cluster.wait_until(member, lambda m=member: "dropped" in m.log(), "the bad messages to be logged", 20)
    after = cluster.settled_states(cluster.nodes)
    assert after["master_node_id"] == before["master_node_id"]
    assert "forged" not in after["runners"]
    assert set(after["nodes"]) == set(before["nodes"])
    assert "dropped a runner_updated from" in alpha.log()
    # Everyone still serves, and nothing was left running by the junk.
    answer = post(beta, {"model": QWEN, "messages": [user("Hello!")], "stop": ["<|im_end|>"]})
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == GREETING_REPLY
    assert all(member.running() for member in cluster.nodes)
    assert not after["tasks"]


def test_concurrent_forwarded_requests_each_get_their_own_answer(cluster: LocalCluster) -> None:
    questions = ["What is the weather in Paris?", "Hello!", "What is the weather in Paris and Tokyo?", "Hello!"]
    results: dict[int, httpx.Response] = {}

    def send(position: int, question: str) -> None:
        target = cluster.nodes[position % len(cluster.nodes)]
        results[position] = post(target, {"model": QWEN, "messages": [user(question)], "tools": [GET_WEATHER_TOOL]})

    threads = [threading.Thread(target=send, args=pair) for pair in enumerate(questions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    alpha = node(cluster, "alpha")
    reference = {
        question: post(alpha, {"model": QWEN, "messages": [user(question)], "tools": [GET_WEATHER_TOOL]})
        for question in set(questions)
    }
    for position, question in enumerate(questions):
        got, expected = results[position].json(), reference[question].json()
        assert results[position].status_code == 200
        assert got["choices"][0]["finish_reason"] == expected["choices"][0]["finish_reason"]
        assert got["choices"][0]["message"]["content"] == expected["choices"][0]["message"]["content"]
        calls = [
            (call["function"]["name"], call["function"]["arguments"])
            for call in got["choices"][0]["message"]["tool_calls"] or []
        ]
        expected_calls = [
            (call["function"]["name"], call["function"]["arguments"])
            for call in expected["choices"][0]["message"]["tool_calls"] or []
        ]
        assert calls == expected_calls
