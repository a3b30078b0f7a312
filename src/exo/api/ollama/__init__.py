"""Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version) on exo's generation."""
