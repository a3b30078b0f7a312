"""MLX inference engine: model loading, generation and the caches that make it fast."""
