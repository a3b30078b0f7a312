"""Tool-calling conformance: a checker for the streaming contract and the `exo conformance` replay command.

`checker.check_stream(payloads, include_usage=...)` checks one streamed response's SSE `data:` payloads against
the streaming contract of docs/TOOL_CALLING.md (and openai-python's accumulator where installed); `cli.main`
replays sample outputs of every tool-call format through the parser and SSE encoder and checks each.
"""
