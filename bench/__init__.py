"""exo's benchmark suite (issue #4): `uv run python -m bench` measures one model on this machine and writes
docs/PERFORMANCE.md with charts in docs/perf/.

Sections: decode speed and time-to-first-token against raw mlx-lm and mlx_lm.server, agent-shaped multi-turn
time-to-first-token with prefix-cache reuse, tool-stream parser cost per segment, and concurrent-stream
throughput. exo and mlx_lm.server run as real subprocesses; the raw baseline runs in a subprocess with the same
BLAS environment and float32 weights the exo runner uses.
"""
