"""Grammars (llguidance's lark dialect) that hold generation to a tool-call format.

Pure text: each format module writes its own call rules through a `LarkWriter` (formats/*.py, `grammar`), and
`tool_calls/request_grammar.py` assembles them with the request's mode: calls only (`required`, a named tool), free
text or checked calls (`strict` tools under "auto"), text that never opens a call (`tool_choice: "none"`), or a JSON
answer (`response_format`). That assembler looks formats up in the registry, so it sits above `formats/`, which build
on this package. The engine compiles the text against the model's tokenizer (worker/engines/mlx/constrained).
"""
