"""What a pipeline hop costs per token on a slow link: run as root, `uv run python -m tests.cluster.rig_hop_cost`.

For each `--nodes` count (2 and 3 by default), that many exo nodes, each in its own network namespace, whose only
link is the rig's userspace netem (tun_link.py): every packet between them — the cluster's links, the model's files
and the ranks' own sockets alike — crosses this process, which holds it for the one-way delay asked. alpha holds
the model and is started with `--min-nodes N`; the others hold nothing and copy their layers from alpha. Once the
split instance is ready, each link setting in turn (added round trip, then a `tc tbf` rate on every end) gets one
untimed warm-up request and `--requests` timed greedy streamed ones, sent to the node of rank 0 (so only the hops
between ranks are on the link, not the answer's way back). Then the others are stopped, the cluster places the
model on alpha alone (degraded), and the same requests time one node. `--cluster-key` keys every node, so the
ranks' sockets run through their TLS relays. `--parallel pipeline,tensor` times each split in turn (a fresh rig
for each; a tensor split's ranks run every layer and sum twice per layer over the link). Prints a Markdown table and
the JSON of every measurement (`--json-out` writes them, with the commit and load, for `bench.report_split_link`). A
benchmark, not a test: it asserts nothing.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.machine import cpu_model, exo_commit
from bench.pipeline_section import ms_per_token
from bench.results import StreamMeasurement
from bench.stream_client import request_body, stream_chat
from exo.api.types.openai_chat import ChatMessage
from exo.shared.types.cluster_api import InstanceList
from tests.cluster.netns_rig import NetnsRig, RigNode
from tests.cluster.rig_split_extras import prefill, rank_memory, streams_at_once
from tests.cluster.tun_link import DEVICE, MTU, TunLink
from tests.exo_server import fixture_model

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a short example."
ADDRESSES = ("10.78.0.1", "10.78.0.2", "10.78.0.3", "10.78.0.4")
READY_TIMEOUT_S = 900.0


def _instances(rig: NetnsRig, node: RigNode) -> InstanceList:
    return InstanceList.model_validate(rig.get(node, "/v1/cluster/instances", timeout=10))


def _ready(rig: NetnsRig, node: RigNode, world_size: int) -> bool:
    ready = [item for item in _instances(rig, node).data if item.ready and item.world_size == world_size]
    return len(ready) == 1


def _rank_zero(rig: NetnsRig, alpha: RigNode) -> str:
    instance = next(item for item in _instances(rig, alpha).data if item.ready)
    return next(rank.node_name for rank in instance.ranks if rank.rank == 0)


def _time_requests(rig: NetnsRig, node: RigNode, model: str, max_tokens: int, requests: int) -> list[StreamMeasurement]:
    body = request_body([ChatMessage(role="user", content=PROMPT)], (), max_tokens)
    body["model"] = model

    async def run() -> list[StreamMeasurement]:
        async with httpx.AsyncClient() as client:
            await stream_chat(client, node.base_url, body)  # warm-up: the link's new setting, first-request work
            return [(await stream_chat(client, node.base_url, body)).measurement for _ in range(requests)]

    return rig.call(node, lambda: asyncio.run(run()))


def _tbf(rig: NetnsRig, rate: str | None) -> None:
    for node in rig.nodes:
        command = ["ip", "netns", "exec", node.namespace, "tc", "qdisc"]
        if rate is None:
            subprocess.run([*command, "del", "dev", DEVICE, "root"], capture_output=True, check=False)
        else:
            # The bucket must hold the link's largest packet (tun_link.MTU), or tbf drops such packets for ever.
            limit = ["rate", rate, "burst", f"{2 * MTU}b", "latency", "400ms"]
            subprocess.run([*command, "replace", "dev", DEVICE, "root", "tbf", *limit], check=True, capture_output=True)


def _row(label: str, runs: list[StreamMeasurement]) -> dict[str, Any]:
    per_token = [ms_per_token(run) for run in runs]
    return {
        "link": label,
        "load_average": os.getloadavg()[0],
        "ms_per_token": per_token,
        "median_ms_per_token": statistics.median(per_token),
        "ttft_ms": [run.ttft_s * 1000 for run in runs],
        "completion_tokens": [run.completion_tokens for run in runs],
    }


def _extras(
    rig: NetnsRig, asked: RigNode, alpha: RigNode, model: str, arguments: argparse.Namespace, *, label: str
) -> dict[str, Any]:
    """Several streams at once, long prompts and each rank's memory (rig_split_extras.py), at no added delay."""
    instance = next(item for item in _instances(rig, alpha).data if item.ready)
    memory = rank_memory(instance, rig.get(alpha, "/state", timeout=10)["runners"])
    row: dict[str, Any] = {"extras": label, "load_average": os.getloadavg()[0], "memory": memory}
    row["streams"] = streams_at_once(rig, asked, model, arguments.max_tokens, arguments.streams)
    row["prefill"] = prefill(rig, asked, model, arguments.requests)
    print(json.dumps(row))
    return row


def _measure(arguments: argparse.Namespace, model_path: Path, node_count: int, parallel: str) -> list[dict[str, Any]]:
    """Rows for a `parallel` split over `node_count` nodes at each link setting, then for the model on alpha alone."""
    rig = NetnsRig(Path(tempfile.mkdtemp(prefix="exo-hop-")), "hop")
    link: TunLink | None = None
    rows: list[dict[str, Any]] = []
    key = ["--cluster-key", arguments.cluster_key] if arguments.cluster_key else []
    try:
        rig.create()
        nodes = [rig.add_node("alpha", [model_path], isolated=True)]
        nodes += [rig.add_node(name, isolated=True) for name in ("beta", "gamma", "delta")[: node_count - 1]]
        for node, address in zip(nodes, ADDRESSES, strict=False):
            node.link_address = address
        link = TunLink([(node.namespace, node.address) for node in nodes])
        link.start()
        alpha = nodes[0]
        alpha_arguments = ["--min-nodes", str(node_count), "--parallel", parallel, "--no-discovery", *key]
        if arguments.models_dir:
            alpha_arguments += ["--models-dir", arguments.models_dir]
        started = time.monotonic()
        rig.start(alpha, alpha_arguments)
        for node in nodes[1:]:
            rig.start(node, ["--no-discovery", "--peer", alpha.endpoint, *key])
        rig.wait_until(lambda: _ready(rig, alpha, node_count), "the split instance", READY_TIMEOUT_S)
        load = os.getloadavg()
        print(f"{parallel} split ready {time.monotonic() - started:.1f} s after start; load average {load[0]:.1f}")
        model = _instances(rig, alpha).data[0].model_id
        rank_zero_name = _rank_zero(rig, alpha)
        rank_zero = next(node for node in nodes if node.name == rank_zero_name)
        for round_trip_ms in (float(text) for text in arguments.round_trips_ms.split(",")):
            link.delay_s = round_trip_ms / 2000
            runs = _time_requests(rig, rank_zero, model, arguments.max_tokens, arguments.requests)
            rows.append(_row(f"{node_count} nodes, {parallel}, +{round_trip_ms:g} ms round trip", runs))
            print(json.dumps(rows[-1]))
        link.delay_s = 0.0
        if arguments.extras:
            rows.append(
                _extras(rig, rank_zero, alpha, model, arguments, label=f"{node_count} nodes, {parallel}, +0 ms")
            )
        for rate in (text for text in arguments.rates.split(",") if text):
            _tbf(rig, rate)
            runs = _time_requests(rig, rank_zero, model, arguments.max_tokens, arguments.requests)
            rows.append(_row(f"{node_count} nodes, {parallel}, tbf {rate}", runs))
            print(json.dumps(rows[-1]))
        _tbf(rig, None)
        for node in nodes[1:]:
            rig.stop(node)
        rig.wait_until(lambda: _ready(rig, alpha, 1), "the model on alpha alone", READY_TIMEOUT_S)
        rows.append(_row(f"1 node (after the {parallel} split, the model on alpha alone)", _time_requests(
            rig, alpha, model, arguments.max_tokens, arguments.requests
        )))  # fmt: skip
        print(json.dumps(rows[-1]))
        if arguments.extras:
            rows.append(_extras(rig, alpha, alpha, model, arguments, label=f"1 node (after the {parallel} split)"))
    finally:
        if link is not None:
            link.close()
        rig.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(fixture_model("tiny-qwen-tools-deep")), help="a model path")
    parser.add_argument("--models-dir", help="alpha's models directory (default: a fresh one)")
    parser.add_argument("--nodes", default="2,3", help="how many nodes to split over, comma-separated (2 to 4)")
    parser.add_argument("--round-trips-ms", default="0,0.1,1,5,20", help="added round trips to time, comma-separated")
    parser.add_argument("--rates", default="10mbit,1mbit", help="tc tbf rates to time (at no added delay)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--cluster-key", help="key every node (the ranks' sockets then run through TLS relays)")
    parser.add_argument("--parallel", default="pipeline", help="splits to time, comma-separated: pipeline, tensor")
    parser.add_argument("--extras", action="store_true", help="also time --streams at once, long prompts, memory")
    parser.add_argument("--streams", type=int, default=4, help="streams at once for --extras")
    parser.add_argument("--json-out", help="also write every row, the commit and the load here (JSON)")
    arguments = parser.parse_args()
    why_not = NetnsRig.unavailable()
    if why_not is not None:
        raise SystemExit(why_not)
    model_path = Path(arguments.model).expanduser()
    rows: list[dict[str, Any]] = []
    for parallel in arguments.parallel.split(","):
        for node_count in (int(text) for text in arguments.nodes.split(",")):
            rows += _measure(arguments, model_path, node_count, parallel)
    load = os.getloadavg()
    if arguments.json_out:
        run = {"commit": exo_commit(), "model": model_path.name, "keyed": bool(arguments.cluster_key)}
        run |= {"machine": f"{cpu_model()}, {os.cpu_count()} cores", "requests": arguments.requests}
        run |= {"max_tokens": arguments.max_tokens, "load_average_end": list(load)}
        run |= {"rows": [row for row in rows if "link" in row], "extras": [row for row in rows if "extras" in row]}
        Path(arguments.json_out).write_text(json.dumps(run, indent=1))
    keyed = "keyed (TLS)" if arguments.cluster_key else "no key (plain TCP)"
    print(f"\nexo {exo_commit()}, model {model_path.name}, {keyed}, rank 0 on the node asked")
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n")
    print("| link between the ranks | ms/token (median) | per request | vs one node | time to first token (ms) |")
    print("|---|---|---|---|---|")
    single: float | None = None
    rows = [row for row in rows if "link" in row]
    for row in rows:
        if row["link"].startswith("1 node"):
            single = row["median_ms_per_token"]
    for row in rows:
        extra = f"{row['median_ms_per_token'] - single:+.1f}" if single is not None else "n/a"
        per_request = ", ".join(f"{value:.1f}" for value in row["ms_per_token"])
        ttft = ", ".join(f"{value:.0f}" for value in row["ttft_ms"])
        print(f"| {row['link']} | {row['median_ms_per_token']:.1f} | {per_request} | {extra} | {ttft} |")


if __name__ == "__main__":
    main()
