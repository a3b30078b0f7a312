"""Grammar-constrained decoding on MLX: the grammars of `exo.tool_calls.grammar` as mlx-lm logits processors.

Which grammar a task needs is decided in `exo.tool_calls.grammar.policy` (a spec), and its text written by
`exo.tool_calls.request_grammar`; nothing here decides. `make_logits_processor(tokenizer, spec, ...)` compiles the
spec against the model's tokenizer; after each sampled token the processor advances an llguidance matcher
and adds -inf to every logit the grammar does not allow.

Why llguidance: it compiles lark grammars with inline `%json` schemas (each tool's schema stays its own root, so
`$defs`/`$ref` work); it handles any tokenizer (an added `<tool_call>` token is matched by id, a spelled-out one by
its text); and it writes the allowed-token bitmask straight into a numpy buffer. Its own `llguidance.mlx` helper is
a Metal kernel that cannot run on Linux, so the mask becomes an additive 0/-inf bias here (on the CPU backend
`mx.where` over 152k logits measured several times slower than the add), reused while the mask is unchanged
(inside strings and free text). xgrammar or outlines-core would only add a dependency for the same job.

What it costs (building the llguidance tokenizer once per model, a grammar's cold and cached compile, the mask per
step, and decoding under each `tool_choice` against unconstrained) is measured by the benchmark: docs/PERFORMANCE.md,
section 5. The processor needs each sampled token before the next mask; a request decoding alone still overlaps
them: its next forward pass is launched before the mask, which is computed while that pass runs
(`generator/solo.py`).
"""

from exo.worker.engines.mlx.constrained.logits_processor import (
    ToolCallConstraintError,
    ToolCallLogitsProcessor,
    make_logits_processor,
)

__all__ = [
    "ToolCallConstraintError",
    "ToolCallLogitsProcessor",
    "make_logits_processor",
]
