"""`exo launch`: point a coding agent (opencode, Claude Code, Codex) at an exo node and run it, in one command.

Each client's knowledge (its configuration, environment and flags) lives in its own module; `plan` holds what they
share, `node` finds the node and the model, `binary` the client's executable, `cli` the command itself.
"""
