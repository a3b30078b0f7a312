"""What the link probe measures while two nodes start and after they settle (issue 34: the bandwidth taken at join
was far below the settled figure). Not a test: a measurement, run by hand.

Two real nodes on 127.0.0.1 (tests/cluster/local_cluster.py): alpha holds the 4-layer test model and asks for it over
two nodes (`--min-nodes 2`, `auto`), beta holds nothing and joins it, both with debug logging. alpha's /state is
read every 0.2 s for `--seconds`; each new figure a node publishes for its link to the other is printed with the
seconds since the nodes were launched, and so is every round of probes each node logged (its small and bulk trips),
and the reason the placement made at start gives.

    uv run python -m tests.cluster.probe_at_join --seconds 75
"""

import argparse
import os
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from tests.cluster.local_cluster import ClusterNode, local_cluster
from tests.exo_server import fixture_model

DEEP = "tiny-qwen-tools-deep"
PROBE_LOG = re.compile(
    r"^(?P<at>\S+ \S+) exo\.cluster\.link_probe DEBUG probe \S+: small trips (?P<small>[^m]*) ms, "
    r"bulk trips (?P<bulk>[^m]*) ms$",
    re.MULTILINE,
)


def figures(state: dict[str, Any]) -> dict[tuple[str, str], tuple[float, float | None, float]]:
    """(node, peer) → (round trip ms, bandwidth MB/s, measured_at) for every link in the state."""
    found: dict[tuple[str, str], tuple[float, float | None, float]] = {}
    for node, view in state.get("nodes", {}).items():
        for peer, link in view["facts"]["links"].items():
            bandwidth = link.get("bandwidth_bytes_per_second")
            found[(node, peer)] = (
                link["round_trip_ms"],
                None if bandwidth is None else bandwidth / 1e6,
                link["measured_at"],
            )
    return found


def probe_rounds(node: ClusterNode, launched_wall: float) -> list[str]:
    rows: list[str] = []
    for match in PROBE_LOG.finditer(node.log()):
        at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp() - launched_wall
        small = [float(trip) for trip in match["small"].split(", ") if trip]
        bulk = [float(trip) for trip in match["bulk"].split(", ") if trip]
        figure = ""
        if small and bulk and min(bulk) > min(small):
            figure = f" → {256 * 1024 / (min(bulk) - min(small)) / 1e3:.0f} MB/s"
        rows.append(f"  {at:6.1f} s {node.name}: small {match['small']} | bulk {match['bulk']}{figure}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--keep-logs", type=Path, help="a folder to run in and leave the nodes' logs in")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = arguments.keep_logs or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        measure(work, arguments.seconds)


def measure(work: Path, seconds: float) -> None:
    with local_cluster(work, "probe-at-join") as cluster:
        print(f"load average before: {os.getloadavg()}")
        launched_wall, launched = time.time(), time.monotonic()
        alpha = cluster.launch("alpha", [fixture_model(DEEP)], extra_arguments=["--min-nodes", "2", "-v"])
        beta = cluster.launch("beta", peers=[alpha], extra_arguments=["-v"])
        names: dict[str, str] = {}
        seen: dict[tuple[str, str], tuple[float, float | None, float]] = {}
        reason = ""
        while time.monotonic() - launched < seconds:
            time.sleep(0.2)
            try:
                state = alpha.state()
                if not names:
                    names = {alpha.node_id: "alpha", beta.node_id: "beta"}
                if not reason:
                    placed = alpha.get("/v1/cluster/instances")["data"]
                    if placed:
                        reason = placed[0].get("parallel_reason") or ""
                        print(f"{time.monotonic() - launched:6.1f} s placed: {reason}")
            except (httpx.HTTPError, OSError, KeyError):
                continue
            for key, figure in figures(state).items():
                if seen.get(key) != figure:
                    seen[key] = figure
                    trip, bandwidth, _at = figure
                    rate = "no bandwidth" if bandwidth is None else f"{bandwidth:.0f} MB/s"
                    print(
                        f"{time.monotonic() - launched:6.1f} s {names.get(key[0], key[0])} → "
                        f"{names.get(key[1], key[1])}: {trip:.3f} ms, {rate}"
                    )
        print(f"load average after: {os.getloadavg()}")
        print("probe rounds as logged (ms):")
        for node in (alpha, beta):
            for row in probe_rounds(node, launched_wall):
                print(row)


if __name__ == "__main__":
    main()
