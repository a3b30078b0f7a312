"""The API keys a node accepts: one key guards the whole cluster.

A node started with `--api-key` publishes a verifier of its key in its facts (shared/api_key_hash.py). Every node
requires a key as soon as it has one of its own or its cluster's state holds a verifier, and accepts its own key or
any key a verifier in the state checks: a node started without a key in a keyed cluster is as closed as the others.
The verifiers never leave the cluster's own links: /state shows them to nobody.

A verifier check is slow by design (PBKDF2), so each key presented is checked once per verifier, off the event
loop and one at a time, and the answer remembered.
"""

import hashlib
import hmac
import secrets
from collections.abc import Callable, Collection, Iterable

import anyio
import anyio.to_thread

from exo.shared.api_key_hash import verifies
from exo.shared.types.api_key import ApiKeyVerifier
from exo.shared.types.state import State

# Keys presented and checked against a verifier, remembered (right or wrong) so a client sending its key with every
# request costs one check; the oldest are forgotten first.
REMEMBERED_CHECKS = 1024


def cluster_verifiers(state: State) -> tuple[ApiKeyVerifier, ...]:
    """The verifiers of every node the cluster knows, up or not: a keyed node that left keeps the cluster keyed."""
    return tuple(node.facts.api_key_verifier for node in state.nodes.values() if node.facts.api_key_verifier)


def without_key_verifiers(state: State) -> State:
    """The state as the API shows it: no node's key verifier in it (they would let anyone guess keys offline)."""
    if not any(node.facts.api_key_verifier is not None for node in state.nodes.values()):
        return state
    nodes = {
        node_id: node.model_copy(update={"facts": node.facts.model_copy(update={"api_key_verifier": None})})
        for node_id, node in state.nodes.items()
    }
    return state.model_copy(update={"nodes": nodes})


class ClusterKeys:
    """This node's own key (or none), the verifiers its cluster publishes, and a loopback key for its own tools."""

    def __init__(self, own_key: str | None, verifiers: Callable[[], Collection[ApiKeyVerifier]]) -> None:
        self._own_key = own_key.encode() if own_key else None
        self._verifiers = verifiers
        # For the node's own /mcp tools, which call its API over loopback: never shown, never sent elsewhere.
        self.loopback_key = own_key or secrets.token_urlsafe(32)
        self._loopback = self.loopback_key.encode()
        self._checked: dict[tuple[bytes, str, str], bool] = {}
        self._one_check_at_a_time = anyio.CapacityLimiter(1)

    def required(self) -> bool:
        return self._own_key is not None or bool(self._verifiers())

    async def accepts(self, presented: Iterable[bytes]) -> bool:
        """Whether one of the `presented` credentials is a key of this cluster."""
        candidates = [credential for credential in presented if credential]
        # Constant-time comparisons, all of them made, so timing does not tell how much of a guess was right.
        local = False
        for credential in candidates:
            local |= hmac.compare_digest(credential, self._loopback)
            if self._own_key is not None:
                local |= hmac.compare_digest(credential, self._own_key)
        if local:
            return True
        verifiers = self._verifiers()
        for credential in candidates:
            for verifier in verifiers:
                if await self._verified(credential, verifier):
                    return True
        return False

    async def _verified(self, credential: bytes, verifier: ApiKeyVerifier) -> bool:
        remembered = (hashlib.sha256(credential).digest(), verifier.salt, verifier.digest)
        known = self._checked.get(remembered)
        if known is None:
            known = await anyio.to_thread.run_sync(verifies, verifier, credential, limiter=self._one_check_at_a_time)
            if len(self._checked) >= REMEMBERED_CHECKS:
                del self._checked[next(iter(self._checked))]
            self._checked[remembered] = known
        return known
