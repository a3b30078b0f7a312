"""The keys a node accepts: its own, any key whose verifier its cluster publishes, and its loopback key; never a
verifier in what /state shows."""

import anyio

from exo.api.cluster_keys import ClusterKeys, cluster_verifiers, without_key_verifiers
from exo.shared.api_key_hash import make_verifier, verifies
from exo.shared.types.api_key import ApiKeyVerifier
from exo.shared.types.common import NodeId
from exo.shared.types.state import NodeFacts, NodeHealth, NodeInfo, NodeMemory, State


def _node(name: NodeId, verifier: ApiKeyVerifier | None) -> NodeInfo:
    facts = NodeFacts(
        node_id=name,
        name=name,
        cluster_endpoints=(),
        api_port=1,
        platform="linux",
        device="cpu",
        mlx_backend="cpu",
        memory=NodeMemory(total_bytes=1, available_bytes=1),
        exo_version="0",
        serves_models=False,
        started_at=0.0,
        api_key_verifier=verifier,
    )
    return NodeInfo(facts=facts, last_seen=0.0, health=NodeHealth(status="healthy"))


def test_a_verifier_checks_its_key_and_nothing_else() -> None:
    verifier = make_verifier("the-key-0123456")
    assert verifies(verifier, b"the-key-0123456")
    assert not verifies(verifier, b"the-key-0123457")
    assert "the-key" not in verifier.model_dump_json()
    assert make_verifier("the-key-0123456").salt != verifier.salt


def test_a_node_without_a_key_requires_its_clusters_keys() -> None:
    verifiers: list[ApiKeyVerifier] = []
    keys = ClusterKeys(None, lambda: verifiers)
    assert not keys.required()
    verifiers.append(make_verifier("alpha-key-0123456"))
    assert keys.required()
    assert anyio.run(keys.accepts, [b"", b"alpha-key-0123456"])
    assert not anyio.run(keys.accepts, [b"beta-key-0123456", b""])
    assert not anyio.run(keys.accepts, [b"", b""])
    assert anyio.run(keys.accepts, [keys.loopback_key.encode()])


def test_a_keyed_node_accepts_its_own_key_and_the_clusters() -> None:
    keys = ClusterKeys("own-key-0123456", lambda: [make_verifier("other-key-0123456")])
    assert keys.required()
    assert anyio.run(keys.accepts, [b"own-key-0123456"])
    assert anyio.run(keys.accepts, [b"other-key-0123456"])
    assert not anyio.run(keys.accepts, [b"own-key-012345"])


def test_the_state_shown_holds_no_verifier() -> None:
    verifier = make_verifier("alpha-key-0123456")
    state = State(
        nodes={NodeId("alpha"): _node(NodeId("alpha"), verifier), NodeId("beta"): _node(NodeId("beta"), None)}
    )
    assert cluster_verifiers(state) == (verifier,)
    shown = without_key_verifiers(state)
    assert all(node.facts.api_key_verifier is None for node in shown.nodes.values())
    assert verifier.digest not in shown.model_dump_json()
