"""One lossy, slow link on the rig (tests/cluster/netns_rig.py): 30 % emulated loss and 50 ms round trip.

alpha serves tiny-qwen-tools on the bridge. beta's namespace has no link at all: it reaches alpha only through the
rig's userspace proxy (tests/cluster/lossy_proxy.py), which delays every chunk 25 ms each way and holds back 30 %
of them for a retransmission timeout more. Requests through beta are still answered, within the bound, and each
takes at least the link's three crossings. The times are printed (`-s`) for docs/CLUSTER.md.
"""

import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.lossy_proxy import LossyProxy
from tests.cluster.netns_rig import CLUSTER_PORT, NetnsRig, RigNode
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import user
from tests.machine_skips import machine_skipif

MODEL = "tiny-qwen-tools"
CHAT: dict[str, Any] = {"model": MODEL, "messages": [user("Hello!")], "max_tokens": 4}
REQUEST_BOUND_S = 10.0
PROXY_PORT = 52500

_WHY_NOT = NetnsRig.unavailable()
pytestmark = machine_skipif(_WHY_NOT)


@pytest.fixture(scope="module")
def lossy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NetnsRig, LossyProxy]]:
    rig = NetnsRig(tmp_path_factory.mktemp("lossy"), "lossy")
    proxy: LossyProxy | None = None
    try:
        rig.create()
        alpha = rig.add_node("alpha", [fixture_model(MODEL)])
        beta = rig.add_node("beta", isolated=True)
        proxy = LossyProxy(
            listen_namespace=beta.namespace,
            listen_port=PROXY_PORT,
            target_namespace=rig.bridge_namespace,
            target=(alpha.address, CLUSTER_PORT),
            delay_s=0.025,
            loss=0.3,
        )
        proxy.start()
        rig.start(alpha)
        rig.start(beta, ["--no-discovery", "--peer", f"tcp/127.0.0.1:{PROXY_PORT}"])
        for node in (alpha, beta):
            rig.wait_until(lambda node=node: _healthy(rig, node) == 2, "both nodes joined", 180)
        rig.wait_until(lambda: _status(rig, beta) == 200, "the model served through beta", 120)
        yield rig, proxy
    finally:
        if proxy is not None:
            proxy.close()
        rig.close()


def _healthy(rig: NetnsRig, node: RigNode) -> int:
    healthy: int = rig.get(node, "/v1/cluster", timeout=5)["nodes_healthy"]
    return healthy


def _status(rig: NetnsRig, node: RigNode) -> int:
    return rig.post(node, "/v1/chat/completions", CHAT).status_code


def _timed(rig: NetnsRig, node: RigNode) -> float:
    started = time.monotonic()
    response = rig.post(node, "/v1/chat/completions", CHAT, timeout=REQUEST_BOUND_S + 5)
    took = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert took <= REQUEST_BOUND_S
    return took


def test_requests_over_a_lossy_slow_link_are_answered_slower(lossy: tuple[NetnsRig, LossyProxy]) -> None:
    rig, proxy = lossy
    alpha, beta = rig.nodes
    lost_before = proxy.lost
    direct: list[float] = []
    through_link: list[float] = []
    for _ in range(8):  # interleaved, so the machine's load weighs on both alike
        direct.append(_timed(rig, alpha))
        through_link.append(_timed(rig, beta))
    assert proxy.lost > lost_before  # the link did lose (and retransmit) chunks meanwhile
    # A forwarded request crosses the link at least three times (the command to the master, the acceptance, the
    # answer), 25 ms each way: slower than that cannot be hidden by the load's noise.
    assert min(through_link) >= 3 * proxy.delay_s
    print(
        f"30% loss + 50 ms: median {statistics.median(through_link) * 1000:.0f} ms through the lossy link "
        f"(max {max(through_link) * 1000:.0f}) against {statistics.median(direct) * 1000:.0f} ms on alpha; "
        f"{proxy.lost} of {proxy.chunks} chunks held back"
    )
