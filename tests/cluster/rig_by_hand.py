"""Run the network-namespace rig by hand (as root): `uv run python -m tests.cluster.rig_by_hand [--nodes 3]
[--cluster-key KEY]`.

Starts the nodes (the first serves tiny-qwen-tools; the others nothing), each in its own namespace behind one bridge,
finding each other by multicast, then reads commands until `quit` (or Ctrl-D), and removes every namespace on exit:

    status                 each node's view: healthy/down counts and master
    ask NODE               one chat completion through NODE, with its status and time
    cut NODE... / heal NODE...     take NODE's link to the bridge down / up (a partition)
    sleep NODE / wake NODE         SIGSTOP / SIGCONT the node's processes (a sleeping machine)
    limit NODE RATE                tc tbf on NODE's outgoing traffic (e.g. 1mbit)
    logs                   the tail of every node's log

Nodes' APIs are at http://10.77.0.N:52415 inside the rig's namespaces (`ip netns exec NAMESPACE curl ...`).
"""

import argparse
import tempfile
import time
from pathlib import Path

from tests.cluster.netns_rig import NetnsRig, RigNode
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import user

NAMES = ("alpha", "beta", "gamma", "delta", "epsilon")


def _status(rig: NetnsRig) -> None:
    for node in rig.nodes:
        try:
            summary = rig.get(node, "/v1/cluster", timeout=3)
            master = summary["master_node_id"]
            print(
                f"{node.name:8} {node.address:12} healthy {summary['nodes_healthy']} down {summary['nodes_down']} "
                f"master {master[:8] if master else None}"
            )
        except Exception as error:
            print(f"{node.name:8} {node.address:12} no answer: {error!r}")


def _ask(rig: NetnsRig, node: RigNode) -> None:
    body = {"model": "tiny-qwen-tools", "messages": [user("Hello!")], "max_tokens": 8}
    started = time.monotonic()
    try:
        response = rig.post(node, "/v1/chat/completions", body, timeout=30)
        print(f"{response.status_code} in {time.monotonic() - started:.2f} s: {response.text[:200]}")
    except Exception as error:
        print(f"no answer after {time.monotonic() - started:.2f} s: {error!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3, choices=range(1, len(NAMES) + 1))
    parser.add_argument("--cluster-key", help="start every node with this cluster key (mutual TLS links)")
    arguments = parser.parse_args()
    why_not = NetnsRig.unavailable()
    if why_not is not None:
        raise SystemExit(why_not)
    rig = NetnsRig(Path(tempfile.mkdtemp(prefix="exo-rig-")), "rig")
    try:
        rig.create()
        for position, name in enumerate(NAMES[: arguments.nodes]):
            node = rig.add_node(name, [fixture_model("tiny-qwen-tools")] if position == 0 else [])
            rig.start(node, ["--cluster-key", arguments.cluster_key] if arguments.cluster_key else [])
        print(f"logs in {rig.work_dir}; type a command (see --help), `quit` to stop")
        by_name = {node.name: node for node in rig.nodes}
        while True:
            try:
                words = input("rig> ").split()
            except EOFError:
                break
            if not words:
                continue
            command, names = words[0], words[1:]
            try:
                match command:
                    case "quit" | "exit":
                        break
                    case "status":
                        _status(rig)
                    case "ask":
                        _ask(rig, by_name[names[0]])
                    case "cut":
                        rig.cut(*(by_name[name] for name in names))
                    case "heal":
                        rig.heal(*(by_name[name] for name in names))
                    case "sleep":
                        rig.sleep(by_name[names[0]])
                    case "wake":
                        rig.wake(by_name[names[0]])
                    case "limit":
                        rig.limit_bandwidth(by_name[names[0]], names[1])
                    case "logs":
                        print(rig.logs())
                    case _:
                        print(f"unknown command {command!r}")
            except (KeyError, IndexError):
                print(f"which node? ({', '.join(by_name)})")
    finally:
        rig.close()


if __name__ == "__main__":
    main()
