"""What the cluster keeps about a request that ended: the dialect it came in, the model and node that served it,
where its time went and how it ended. Never its prompt or its output, only their token counts.

The node whose API took the request records it (api/request_log.py); /state lists each node's most recent
ones under that node (`NodeInfo.recent_requests`), so every node's dashboard shows the whole cluster's.
"""

from typing import Literal

from exo.shared.types.chunks import TaskErrorKind
from exo.shared.types.common import FinishReason, FrozenModel, ModelId, NodeId

Dialect = Literal["chat.completions", "messages", "responses", "ollama.chat", "ollama.generate"]
# finished: the model's answer reached its end (`finish_reason`); failed: the task ended with an error (`error`);
# cancelled: the client left before the end.
RequestOutcome = Literal["finished", "failed", "cancelled"]

# How many ended requests each node keeps in /state (the oldest leave first).
RECENT_REQUESTS_PER_NODE = 20
# An error message is cut to this length in /state (the full one is in the node's log).
ERROR_MESSAGE_CHARS = 300


class RequestRecord(FrozenModel):
    dialect: Dialect
    model_id: ModelId
    # The node whose runner served it (the node listing it is the one whose API took it).
    served_by: NodeId
    outcome: RequestOutcome
    finish_reason: FinishReason | None = None
    # Why a failed request failed: the task's error kind (None when it ended with no result at all) and message.
    error_kind: TaskErrorKind | None = None
    error: str | None = None
    # Token counts, as far as the request got (None where it never got there): the whole prompt, the part the
    # prefix cache gave (memory and disk together), the part read from its disk tier, the tokens generated.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    disk_cached_tokens: int | None = None
    completion_tokens: int | None = None
    # From arrival to the start of prefill, the prefill itself, and from arrival to the first output.
    queue_seconds: float | None = None
    prefill_seconds: float | None = None
    time_to_first_token_seconds: float | None = None
    # The tokens after the first, over the time after the first.
    decode_tokens_per_second: float | None = None
    # Unix time the request ended.
    ended_at: float
