"""Generation on MLX: the token loop, stop sequences and the tool-call stream parser."""
