"""A node's stable identity: a random id created once and kept in `$EXO_HOME/node_id`, so a restarted node comes
back as itself instead of leaving a ghost behind. A lock stops two running nodes from sharing one identity."""

import fcntl
import re
import secrets
from pathlib import Path
from typing import TextIO

from exo.shared.types.common import NodeId

_NODE_ID = re.compile(r"^[1-9a-f][0-9a-f]{31}$")


class NodeIdentityError(RuntimeError):
    """The identity file is unreadable, or another running node holds it."""


def is_node_id(text: str) -> bool:
    """32 lowercase hex digits without a leading zero, as `new_node_id` draws them."""
    return _NODE_ID.match(text) is not None


def new_node_id() -> NodeId:
    """32 lowercase hex digits without a leading zero: also a valid zenoh session id."""
    return NodeId(secrets.choice("123456789abcdef") + secrets.token_hex(16)[1:])


class NodeIdentity:
    """The claimed identity; holds the lock on `$EXO_HOME/node.lock` until `release()` (or the process ends)."""

    def __init__(self, node_id: NodeId, lock: TextIO) -> None:
        self.node_id = node_id
        self._lock = lock

    def release(self) -> None:
        self._lock.close()


def claim_node_identity(exo_home: Path) -> NodeIdentity:
    """Read (or create) this home's node id and lock it for this process."""
    exo_home.mkdir(parents=True, exist_ok=True)
    lock = (exo_home / "node.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise NodeIdentityError(
            f"another exo node is running with EXO_HOME={exo_home}; give each node on one machine its own EXO_HOME"
        ) from None
    path = exo_home / "node_id"
    if path.exists():
        text = path.read_text().strip()
        if not _NODE_ID.match(text):
            lock.close()
            raise NodeIdentityError(f"{path} does not hold a node id ({text[:40]!r}); delete it to get a new identity")
        return NodeIdentity(NodeId(text), lock)
    node_id = new_node_id()
    temporary = path.with_suffix(".tmp")
    temporary.write_text(node_id + "\n")
    temporary.replace(path)
    return NodeIdentity(node_id, lock)
