"""The reply-must-be-JSON control every protocol has (`response_format`, `text.format`, `output_config.format`)."""

from jsonschema import SchemaError
from jsonschema.validators import validator_for
from pydantic import JsonValue

from exo.api.adapters.schema_depth import check_schema_depth
from exo.api.adapters.schema_termination import CheckBudget, self_application_cycle, unfinishable_reason
from exo.api.adapters.tool_controls import unservable_schema
from exo.api.errors import ApiError
from exo.shared.types.tasks import StructuredOutput


def json_output(schema: dict[str, JsonValue], *, strict: bool, where: str) -> StructuredOutput:
    """The structured output for `schema` (found at `where` in the request), refused with a 400 if it is not a
    valid JSON Schema, nests too deep (see schema_depth.py) or nothing can finish it (the grammar always enforces
    it). What is valid but beyond llguidance is refused by the runner when it compiles the grammar.
    """
    check_schema_depth(schema, where)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as error:
        raise ApiError(400, f"{where} is not a valid JSON Schema: {error.message}", param=where) from error
    budget = CheckBudget()
    problem = self_application_cycle(schema, budget) or unfinishable_reason(schema, budget)
    if problem is not None:
        raise unservable_schema(where, problem)
    return StructuredOutput(json_schema=schema, strict=strict)
