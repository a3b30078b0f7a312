"""Which grammar constraint a task's tool policy needs, as mlx-lm logits processors."""

from collections.abc import Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.shared.types.api import FunctionDefinition
from exo.shared.types.tasks import ToolPolicy
from exo.worker.engines.mlx.constrained import (
    ConstraintMode,
    ReasoningMarkers,
    ToolConstraintSpec,
    UnsupportedConstraintError,
    make_tool_logits_processor,
)
from exo.worker.engines.mlx.generator.generate import LogitsProcessor


def callable_functions(policy: ToolPolicy) -> tuple[FunctionDefinition, ...]:
    """The tools the model may call: all offered ones, or the subset a named choice / allowed_tools picked."""
    if policy.mode == "none":
        return ()
    if not policy.callable_tools:
        return policy.tools
    allowed = set(policy.callable_tools)
    return tuple(tool for tool in policy.tools if tool.name in allowed)


def constraint_mode(policy: ToolPolicy) -> ConstraintMode | None:
    match policy.mode:
        case "none":
            return None
        case "required":
            return ConstraintMode.REQUIRED
        case "named":
            return ConstraintMode.NAMED
        case "auto":
            return ConstraintMode.STRICT_AUTO if any(tool.strict for tool in callable_functions(policy)) else None


def logits_processors_for(
    tokenizer: TokenizerWrapper,
    tool_format: str,
    policy: ToolPolicy,
    *,
    prompt_length: int,
    reasoning: ReasoningMarkers | None = None,
) -> Sequence[LogitsProcessor]:
    """Processors enforcing the policy (none for plain "auto"); raises UnsupportedConstraintError → HTTP 400."""
    mode = constraint_mode(policy)
    if mode is None:
        return ()
    spec = ToolConstraintSpec(
        tool_format=tool_format,
        tools=callable_functions(policy),
        mode=mode,
        parallel_tool_calls=policy.parallel_tool_calls and mode is not ConstraintMode.NAMED,
        reasoning=reasoning,
    )
    return (make_tool_logits_processor(tokenizer, spec, prompt_length=prompt_length),)


__all__ = ["UnsupportedConstraintError", "callable_functions", "logits_processors_for"]
