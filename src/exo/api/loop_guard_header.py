"""The per-request loop-guard override for clients that cannot add a body field: the `X-Exo-Loop-Guard` header.

Claude Code, Codex and most Ollama clients send a fixed body but let the user add headers, so every dialect reads
the header (`off`, `warn`, `block` or `answer`, any case). A request's own `loop_guard` body field, in the dialects
that take one (chat completions, Ollama's /api/chat), wins over the header; either wins over the node's setting.
"""

from typing import Final, get_args

from fastapi import Request

from exo.api.errors import ApiError
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.tasks import LOOP_GUARD_HEADER, LoopGuardPolicy

_POLICIES: Final[tuple[LoopGuardPolicy, ...]] = get_args(LoopGuardPolicy)


def header_policy(http_request: Request) -> LoopGuardPolicy | None:
    """The policy the request's header names (None without the header); any other value is a 400 naming it."""
    value = http_request.headers.get(LOOP_GUARD_HEADER)
    if value is None:
        return None
    for policy in _POLICIES:
        if value.strip().lower() == policy:
            return policy
    raise ApiError(
        400,
        f"header {LOOP_GUARD_HEADER}: {value!r} is not a loop-guard policy (use one of {', '.join(_POLICIES)})",
        param=LOOP_GUARD_HEADER,
        code="invalid_header",
    )


def with_header_policy(command: GenerateCommand, policy: LoopGuardPolicy | None) -> GenerateCommand:
    """`command` with the header's policy, unless the body chose one."""
    tool_policy = command.params.tool_policy
    if policy is None or tool_policy.loop_guard is not None:
        return command
    params = command.params.model_copy(update={"tool_policy": tool_policy.model_copy(update={"loop_guard": policy})})
    return command.model_copy(update={"params": params})
