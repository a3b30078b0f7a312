"""The incremental tool-call stream parser: generated text in, typed chunks out.

`ToolStreamParser(format, tools, ...)` is fed each decoded segment and returns `ParsedChunk`s
(TokenChunk | ReasoningChunk | ToolCallChunk | ToolCallArgumentsChunk); a non-streaming response is the same
chunks collected, so streaming and non-streaming agree by construction.
`detect_tool_format` picks the format from mlx-lm's `tool_parser_type` or the chat template.

Emission
- Content is emitted at once, except a suffix that could still begin a marker, which is held until decided
  (then released as content if it was not one). Whitespace-only runs wait for the next content: next to a
  tool call they are markup and are dropped, as is whitespace between the pieces of a call region.
- A call is emitted as a ToolCallChunk (index 0, 1, 2…, a fresh id, the name) once its name is known and
  valid, then its arguments as ToolCallArgumentsChunk fragments as they are generated. The fragments
  concatenate to JSON and no proper prefix of them parses (the first fragment is never empty, never `{}`).
- Arguments are checked against the tool's JSON schema. Only unambiguous mismatches are coerced: "5" → 5 and
  "2.5" → 2.5 where the schema says integer/number, "true"/"false" → booleans, JSON text → object/array where
  the schema says object/array, 5.0 → 5 where it says integer only. Nothing is ever invented. Raw control
  characters inside strings are written as JSON escapes (the same string value, now valid JSON).
- Inside reasoning (`<think>…</think>`, or from the start when `starts_in_reasoning`) nothing is a call.
  Reasoning opens only before the answer: once content (other than whitespace) or a tool call was emitted,
  `<think>` and `</think>` are plain content, so reasoning never follows the answer.

Failure rule
- BEFORE a call is committed (its name parsed and found in the request's tools) any failure (malformed
  syntax, an unknown tool name, a missing name, generation ending) gives the RAW text of that call, markers
  included, back as content (TokenChunk), and adds the reason to `failures`. A reply with no call marker
  that only began like a bare call (a code fence of another language, a JSON object whose keys are not
  "name"/"arguments"/"parameters", a list or markdown link that is not `[f(...)]`) is ordinary content: it
  comes back the same way, and is not a failure.
- AFTER commit the call stands. Its arguments are never altered beyond the coercions above, never completed,
  never dropped: if the model's JSON breaks mid-way or generation ends inside the call (max_tokens), the
  arguments are the model's text as far as it went (a remainder that is not JSON is still sent verbatim as
  argument fragments) and `failures` says why; the runner then reports finish_reason "length" for
  max_tokens. Schema violations (a missing required key…) keep the call and are added to `failures`, so an
  agent can feed the error back to the model.
- With `parallel_tool_calls=False`, once the first call is complete `should_stop` is True and all later
  text is discarded: the only text this parser ever discards.

Layout: `stream_parser.py` (the state machine), `format.py` (the one interface a format implements), one module
per format in `formats/` (its markers, its region reader, its grammar, its history needs), the argument machinery
in `arguments/` (schema-aware JSON streaming, coercion, validation), region readers shared by several formats in
`regions/`, and the grammar side in `grammar/` (`grammar/policy.py` decides which grammar a request needs,
`grammar/exclusion.py` rules out given arguments, `request_grammar.py` assembles the text). `registry.py` maps each
`ToolFormatName` to its module.
"""

from exo.tool_calls.detect import detect_tool_format
from exo.tool_calls.names import ToolFormatName
from exo.tool_calls.stream_parser import ToolStreamParser

__all__ = ["ToolFormatName", "ToolStreamParser", "detect_tool_format"]
