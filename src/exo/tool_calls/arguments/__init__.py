"""Tool-call arguments: the schema-aware JSON streamer, coercion and validation, and text/Python value readers."""
