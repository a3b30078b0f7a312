"""exo's own tools for agents: an MCP server (stdio `exo mcp`, and `/mcp` on every node) over the node's HTTP API.

The tools are plain async functions of a typed node client (`node_client.py`) returning typed results; `server.py`
turns them into MCP tools with annotations, a structured result and a readable text. The package never imports MLX.
"""
