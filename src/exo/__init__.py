"""exo: an LLM inference node on MLX with first-class tool calling."""
