"""Grammars (llguidance's lark dialect) that hold generation to a tool-call format.

Pure text: `policy.py` decides from a request which grammar it needs (a spec whose `ReplyShape` says what the reply
may be: calls only for `required` or a named tool, free text or checked calls under "auto", text that never opens a
call for `tool_choice: "none"`, or a JSON answer for `response_format`), each format module writes its own call rules
through a `LarkWriter` (formats/*.py, `grammar`), and `tool_calls/request_grammar.py` assembles them for the spec.
That assembler looks formats up in the registry, so it sits above `formats/`, which build on this package. The engine
compiles the text against the model's tokenizer (worker/engines/mlx/constrained).
"""
