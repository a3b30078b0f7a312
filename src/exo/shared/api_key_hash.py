"""Salted PBKDF2 verifiers of API keys: made once by the node that holds a key, checked by every node."""

import hashlib
import hmac
import secrets

from exo.shared.types.api_key import ApiKeyVerifier

# About 30-60 ms per check on a small CPU: slow for an offline guesser, and each key presented is checked once per
# verifier and then remembered (api/cluster_keys.py).
ITERATIONS = 100_000


def make_verifier(key: str) -> ApiKeyVerifier:
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", key.encode(), salt, ITERATIONS)
    return ApiKeyVerifier(salt=salt.hex(), iterations=ITERATIONS, digest=digest.hex())


def verifies(verifier: ApiKeyVerifier, presented: bytes) -> bool:
    """Whether `presented` is the key `verifier` was made from (compared in constant time)."""
    digest = hashlib.pbkdf2_hmac("sha256", presented, bytes.fromhex(verifier.salt), verifier.iterations)
    return hmac.compare_digest(digest.hex(), verifier.digest)
