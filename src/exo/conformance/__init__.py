"""Tool-calling conformance: a checker for the streaming contract and the `exo conformance` replay command.

`checker.check_stream(payloads, include_usage=...)` checks one streamed response's SSE `data:` payloads against
shared/TOOL-CALLING-CONTRACT.md and openai-python's accumulator; `cli.main` replays sample outputs of every
tool-call format through the parser and SSE encoder and checks each.
"""
