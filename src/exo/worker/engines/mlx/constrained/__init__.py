"""Grammar-constrained decoding that enforces `tool_choice` on MLX generation.

`tool_choice: "required"`, a named function, `allowed_tools`, `parallel_tool_calls: false` and
`tools[].function.strict: true` become a grammar over the model's own tool-call format (Hermes/Qwen `<tool_call>`
blocks, Llama 3 JSON), with each tool's JSON schema embedded for its arguments. The grammar runs as an mlx-lm
logits processor: after each sampled token it advances an llguidance matcher and adds -inf to every logit the
grammar does not allow, so the model can only write calls that parse, name an offered tool and validate.

Why llguidance: it is already a dependency; it compiles lark grammars with inline `%json` schemas (each tool's
schema stays its own root, so `$defs`/`$ref` work); it handles any tokenizer (an added `<tool_call>` token is
matched by id, a spelled-out one by its text); and it writes the allowed-token bitmask straight into a numpy
buffer. Its own `llguidance.mlx` helper is a Metal kernel that cannot run on Linux, so the mask becomes an
additive 0/-inf bias here (on the CPU backend `mx.where` over 152k logits measured several times slower than the
add), reused while the mask is unchanged (inside strings and free text). xgrammar or outlines-core would only add
a dependency for the same job.

Measured on the 2-core x86 CPU with the default model's 151,936-token vocabulary and ten opencode-sized tools
(about 11,000 schema characters): the llguidance tokenizer builds in about 1.1 s, once per loaded model; a grammar
compiles in 5–7 ms cold and 0.25 ms from the cache; the llguidance mask takes about 2 µs median (up to about 1 ms
on the step that enters a schema); the whole processor step is about 45 µs median, 100 µs mean and 330–420 µs p99.
That model decodes at about 150 ms a token on this CPU. The processor needs each sampled token before the next
mask, so it gives up mlx-lm's overlap of one step's Python work with the previous step's compute.

Use: `constraint_needed(...)` decides, the runner builds a `ToolConstraintSpec`, then
`make_tool_logits_processor(tokenizer, spec, prompt_length=...)` goes into mlx-lm's `logits_processors`.

Structured outputs (`response_format` json_object / json_schema) use the same machinery: a `JsonAnswerSpec` and
`make_answer_logits_processor(...)` hold the reply's content to one JSON value valid against the schema (or, under
`tool_choice: "auto"`, calls in its place); see structured_output.py.
"""

from exo.worker.engines.mlx.constrained.grammar import SUPPORTED_FORMATS, build_tool_grammar
from exo.worker.engines.mlx.constrained.logits_processor import (
    ToolCallConstraintError,
    ToolCallLogitsProcessor,
    make_tool_logits_processor,
)
from exo.worker.engines.mlx.constrained.spec import (
    ConstraintMode,
    ReasoningMarkers,
    ToolConstraintSpec,
    UnsupportedConstraintError,
    constraint_needed,
    select_constrained_tools,
)
from exo.worker.engines.mlx.constrained.structured_output import (
    JsonAnswerSpec,
    build_answer_grammar,
    make_answer_logits_processor,
)

__all__ = [
    "SUPPORTED_FORMATS",
    "ConstraintMode",
    "JsonAnswerSpec",
    "ReasoningMarkers",
    "ToolCallConstraintError",
    "ToolCallLogitsProcessor",
    "ToolConstraintSpec",
    "UnsupportedConstraintError",
    "build_answer_grammar",
    "build_tool_grammar",
    "constraint_needed",
    "make_answer_logits_processor",
    "make_tool_logits_processor",
    "select_constrained_tools",
]
