"""Tool definitions and tool-choice controls, whatever the wire protocol: every dialect ends up as one ToolPolicy.

Chat Completions, the Messages API and the Responses API name these things differently (`required` / `any`,
`parallel_tool_calls` / `disable_parallel_tool_use`); each adapter maps its names onto the arguments here, so the
checks and the policy the engine enforces are the same for all three.
"""

import re
from collections.abc import Sequence
from typing import Final

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from exo.api.adapters.schema_depth import check_schema_depth
from exo.api.adapters.schema_termination import (
    CheckBudget,
    as_tool_parameters,
    self_application_cycle,
    unfinishable_reason,
)
from exo.api.errors import ApiError
from exo.shared.types.tasks import ToolChoiceMode, ToolPolicy
from exo.shared.types.tool_spec import ToolSpec

MAX_TOOL_NAME_LENGTH = 64
# OpenAI's pattern for function names: ASCII only (`str.isalnum` would let "météo" or "工具" through).
TOOL_NAME: Final = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_TOOL_NAME_LENGTH}}}")


def check_functions(
    functions: Sequence[ToolSpec], *, field_prefix: str = "", schema_field: str = "parameters"
) -> tuple[ToolSpec, ...]:
    """Refuse bad names, duplicates and invalid JSON Schemas of `tools[i]` (whose fields sit under `field_prefix`),
    schemas nested too deep for any reader (see schema_depth.py) and schemas that apply themselves to the same value
    without end (no validator can evaluate them)."""
    seen: set[str] = set()
    budget = CheckBudget()
    for position, function in enumerate(functions):
        where = f"tools[{position}]"
        name = function.name
        if not TOOL_NAME.fullmatch(name):
            field = f"{where}.{field_prefix}name"
            raise ApiError(400, f"{field} '{name}' must be 1-64 ASCII letters, digits, '_', '-' or '.'", param=field)
        if name in seen:
            raise ApiError(400, f"{where}: duplicate tool name '{name}'", param=f"{where}.{field_prefix}name")
        seen.add(name)
        schema_param = f"{where}.{field_prefix}{schema_field}"
        check_schema_depth(function.parameters, schema_param)
        try:
            validator_for(function.parameters).check_schema(function.parameters)
        except SchemaError as error:
            raise ApiError(
                400, f"{schema_param} is not a valid JSON Schema: {error.message}", param=schema_param
            ) from error
        if (cycle := self_application_cycle(function.parameters, budget)) is not None:
            raise unservable_schema(schema_param, cycle)
    return tuple(functions)


def unservable_schema(param: str, problem: str) -> ApiError:
    """The 400 for a schema nothing can finish (see schema_termination.py)."""
    return ApiError(400, f"{param} cannot be served: {problem}", param=param, code="unsupported")


def _grammar_enforced(policy: ToolPolicy) -> set[str]:
    """The names of the tools whose schemas the grammar enforces: the callable ones when calls are forced or any
    callable tool is strict; none under plain "auto" (the parser checks arguments after the fact there)."""
    callable_names = set(policy.callable_tools) or {tool.name for tool in policy.tools}
    if policy.mode in ("required", "named"):
        return callable_names
    strict = any(tool.strict for tool in policy.tools if tool.name in callable_names)
    return callable_names if policy.mode == "auto" and strict else set()


def check_enforced_schemas(policy: ToolPolicy, *, field_prefix: str = "", schema_field: str = "parameters") -> None:
    """400 `unsupported` for a tool schema the grammar will enforce that no finite value satisfies (a required
    chain that never ends): generation could never finish it. Plain "auto" stays lenient, as documented."""
    budget = CheckBudget()
    enforced = _grammar_enforced(policy)
    for position, tool in enumerate(policy.tools):
        if tool.name in enforced:
            problem = unfinishable_reason(as_tool_parameters(tool.parameters), budget)
            if problem is not None:
                raise unservable_schema(f"tools[{position}].{field_prefix}{schema_field}", problem)


def allowed_tool_names(entries: Sequence[dict[str, object]], names: set[str], param: str) -> tuple[str, ...]:
    """The names an `allowed_tools` list picks: entries `{"type": "function", "name"}` or `{…, "function": {…}}`."""
    result: list[str] = []
    for position, entry in enumerate(entries):
        function = entry.get("function")
        name = function.get("name") if isinstance(function, dict) else entry.get("name")
        if not isinstance(name, str) or name not in names:
            raise ApiError(400, f"{param}.tools[{position}] must name a tool from tools", param=param)
        result.append(name)
    if not result:
        raise ApiError(400, f"{param}.tools must not be empty", param=param)
    return tuple(result)


def build_policy(
    tools: tuple[ToolSpec, ...],
    mode: ToolChoiceMode,
    *,
    callable_tools: tuple[str, ...] = (),
    parallel_tool_calls: bool = True,
    choice_param: str = "tool_choice",
) -> ToolPolicy:
    """The policy for checked `tools`: `mode` with, for `named` or a subset, the `callable_tools` it names.

    A choice that needs tools (`required`, a named tool) without any is a 400; a named tool must be among them.
    A named choice always means exactly one call.
    """
    if not tools:
        if mode not in ("none", "auto"):
            raise ApiError(400, f"{choice_param} requires a non-empty tools list", param=choice_param)
        return ToolPolicy(mode="none")
    names = {tool.name for tool in tools}
    for name in callable_tools:
        if name not in names:
            raise ApiError(400, f"{choice_param} names '{name}', which is not in tools", param=choice_param)
    return ToolPolicy(
        tools=tools,
        callable_tools=callable_tools,
        mode=mode,
        parallel_tool_calls=parallel_tool_calls and mode != "named",
        unenforceable_tools=_unfinishable_under_auto(tools) if mode == "auto" else (),
    )


def _unfinishable_under_auto(tools: tuple[ToolSpec, ...]) -> tuple[str, ...]:
    """Non-strict tools whose schemas no finite value satisfies: the lazy "auto" grammar leaves their arguments to
    validation (a strict one is refused by `check_enforced_schemas` instead)."""
    budget = CheckBudget()
    return tuple(
        tool.name
        for tool in tools
        if not tool.strict and unfinishable_reason(as_tool_parameters(tool.parameters), budget) is not None
    )
