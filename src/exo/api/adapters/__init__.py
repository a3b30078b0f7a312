"""Adapters between the OpenAI wire protocol and the node's typed commands and chunks."""
