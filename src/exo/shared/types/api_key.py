"""What a node with `--api-key` tells the cluster about its key: a salted, slow hash that checks a key without
revealing it. Every node of the cluster then requires one of the cluster's keys (see api/cluster_keys.py)."""

from pydantic import Field

from exo.shared.types.common import FrozenModel


class ApiKeyVerifier(FrozenModel):
    """PBKDF2-HMAC-SHA256 of the key with `salt` over `iterations` rounds (hex)."""

    algorithm: str = "pbkdf2-sha256"
    salt: str = Field(min_length=16, max_length=128, pattern="^[0-9a-f]+$")
    # Bounded both ways: a verifier too cheap to slow a guesser, or too costly to check, is not a valid one.
    iterations: int = Field(ge=10_000, le=1_000_000)
    digest: str = Field(min_length=64, max_length=64, pattern="^[0-9a-f]+$")
