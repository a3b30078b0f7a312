"""The wire types of the Anthropic Messages and OpenAI Responses dialects (chat completions' types stay in
exo.shared.types.api: the MCP tools and the tool-call engine use them too; Ollama's are in exo.api.ollama.wire)."""
