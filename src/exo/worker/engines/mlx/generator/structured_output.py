"""Which grammar a task needs when it also asks for structured output (`response_format` json_object/json_schema)."""

from collections.abc import Sequence

from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.shared.types.tasks import StructuredOutput, ToolPolicy
from exo.worker.engines.mlx.constrained import JsonAnswerSpec, ReasoningMarkers, make_answer_logits_processor
from exo.worker.engines.mlx.generator.constraints import callable_functions, logits_processors_for
from exo.worker.engines.mlx.generator.generate import LogitsProcessor


def answer_spec(
    output: StructuredOutput, tool_format: str, policy: ToolPolicy, reasoning: ReasoningMarkers | None
) -> JsonAnswerSpec | None:
    """The JSON-answer constraint for the task, or None when the tool policy forces calls (and the answer format
    then has nothing to shape: OpenAI accepts the field and the reply is the calls).

    `tool_choice: "none"` or no tools: the reply is the JSON answer. "auto": the answer, or calls in its place.
    """
    if policy.mode in ("required", "named"):
        return None
    tools = callable_functions(policy)
    return JsonAnswerSpec(
        json_schema=output.json_schema,
        every_keyword_enforced=output.strict,
        reasoning=reasoning,
        tool_format=tool_format,
        tools=tools,
        tool_schemas_enforced=any(tool.strict for tool in tools),
        parallel_tool_calls=policy.parallel_tool_calls,
    )


def structured_logits_processors(
    tokenizer: TokenizerWrapper,
    tool_format: str,
    policy: ToolPolicy,
    output: StructuredOutput | None,
    *,
    prompt_length: int,
    reasoning: ReasoningMarkers | None = None,
) -> Sequence[LogitsProcessor]:
    """`logits_processors_for`, with the reply's content held to `output` when the task asks for structured output.

    Raises UnsupportedConstraintError (→ HTTP 400) for a schema or tool format the grammar cannot enforce.
    """
    spec = answer_spec(output, tool_format, policy, reasoning) if output is not None else None
    if spec is None:
        return logits_processors_for(tokenizer, tool_format, policy, prompt_length=prompt_length, reasoning=reasoning)
    return (make_answer_logits_processor(tokenizer, spec, prompt_length=prompt_length),)
