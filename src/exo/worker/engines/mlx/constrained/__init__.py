"""Grammar-constrained decoding that enforces `tool_choice` on MLX generation.

`tool_choice: "required"`, a named function, `allowed_tools`, `parallel_tool_calls: false` and
`tools[].function.strict: true` become a grammar over the model's own tool-call format (Hermes/Qwen `<tool_call>`
blocks, Llama 3 JSON), with each tool's JSON schema embedded for its arguments. The grammar runs as an mlx-lm
logits processor: after each sampled token it advances an llguidance matcher and adds -inf to every logit the
grammar does not allow, so the model can only write calls that parse, name an offered tool and validate.

Why llguidance: it is already a dependency, compiles lark grammars with inline `%json` schemas (each tool's schema
stays its own root, so `$defs`/`$ref` work), handles any tokenizer (an added `<tool_call>` token is matched by id,
a spelled-out one by text), and computes a mask into a numpy buffer in microseconds. Measured on the 2-core
x86 CPU with the default model's 151,936-token vocabulary and ten opencode-sized tools (about 11,000 schema
characters): building the llguidance tokenizer about 1 s once per model, compiling the grammar about 5 ms cold
and 0.2 ms from the cache, the llguidance mask about 2 µs median (up to about 1 ms on the step that enters a
schema), and the whole processor step about 60–140 µs median including the bias add, against a decode step of
about 150 ms for that model on this CPU. xgrammar and outlines-core would need a new dependency and neither ships
an MLX/CPU path better than a numpy bitmask; llguidance's own `llguidance.mlx` helper is a Metal kernel that does
not run on Linux.

Use: `constraint_needed(...)` decides, the runner builds a `ToolConstraintSpec`, then
`make_tool_logits_processor(tokenizer, spec, prompt_length=...)` goes into mlx-lm's `logits_processors`.
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

__all__ = [
    "SUPPORTED_FORMATS",
    "ConstraintMode",
    "ReasoningMarkers",
    "ToolCallConstraintError",
    "ToolCallLogitsProcessor",
    "ToolConstraintSpec",
    "UnsupportedConstraintError",
    "build_tool_grammar",
    "constraint_needed",
    "make_tool_logits_processor",
    "select_constrained_tools",
]
