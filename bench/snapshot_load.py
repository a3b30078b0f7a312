"""`uv run python -m bench.snapshot_load [--model SPEC] [--tokens N,...] [--loads R]`: what the prefix cache weighs
when the disk holds more of a prompt than memory: a snapshot's load against the prefill of the tokens it adds.

On the model as exo's runner loads it, for each prompt length: the runner's own `PromptPrefill` prefills the prompt
(pieces paced as shipped), telling the prefix cache each piece's cost as the runner's scheduler does; the cache's
snapshot is written to a disk tier in a temporary folder; a second prefix cache on that folder (a restarted runner)
is given the same prefill measurements and loads the snapshot `--loads` times (the file in the page cache after the
first). Reported: the running averages the rule decides with, the load's wall time, and the break-even: how many
tokens a load must add to memory's match to be chosen. Prints a Markdown table with the commit, CPU, load and command,
for docs/PERFORMANCE.md.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from bench.in_process import load_as_the_runner_does, print_run_header
from bench.machine import record_start_commit
from bench.worker_process import with_runners_blas

if TYPE_CHECKING:
    from exo.worker.engines.mlx.loaded_model import LoadedModel


def main(argv: Sequence[str] | None = None) -> None:
    command = list(sys.argv[1:] if argv is None else argv)
    with_runners_blas("bench.snapshot_load", command)
    _measure(command)


def _measure(command: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot_load")
    parser.add_argument("--model", help="model spec as `exo --model` takes it (default: exo's default model)")
    parser.add_argument("--tokens", default="2000,8000", help="prompt lengths, comma-separated")
    parser.add_argument("--loads", type=int, default=3, help="loads of each snapshot")
    arguments = parser.parse_args(command)
    loaded = load_as_the_runner_does(arguments.model)
    load_before = os.getloadavg()
    rows = [measure_length(loaded, int(value), arguments.loads) for value in arguments.tokens.split(",")]
    title = f"A disk snapshot's load against the prefill it saves, {loaded.dtype} weights"
    print_run_header(title, command, "bench.snapshot_load", load_before)
    print(
        "| Prompt tokens | Snapshot MB | Cold prefill s | Prefill ms a token (rule's average) | Loads ms, each |"
        " Load µs a token (median) | Load ns a byte (rule's average) | Break-even: tokens a load must add |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(row.markdown() for row in rows))


class SnapshotLoadRow(BaseModel):
    """One prompt length's measurements."""

    prompt_tokens: int
    snapshot_bytes: int
    cold_prefill_seconds: float
    prefill_seconds_per_token: float
    """The prefix cache's running average over the prefill's pieces (what its rule decides with)."""
    load_seconds: list[float]
    load_seconds_per_byte: float
    """The running average over the loads."""

    @property
    def break_even_tokens(self) -> float:
        """How many tokens a load of this snapshot must add to memory's match for the rule to choose it."""
        return self.snapshot_bytes * self.load_seconds_per_byte / self.prefill_seconds_per_token

    def markdown(self) -> str:
        return (
            f"| {self.prompt_tokens:,} | {self.snapshot_bytes / 1e6:,.0f} | {self.cold_prefill_seconds:.1f} | "
            f"{self.prefill_seconds_per_token * 1000:.2f} | "
            f"{', '.join(f'{seconds * 1000:.0f}' for seconds in self.load_seconds)} | "
            f"{statistics.median(self.load_seconds) / self.prompt_tokens * 1e6:.1f} | "
            f"{self.load_seconds_per_byte * 1e9:.3f} | "
            f"{self.break_even_tokens:,.0f} ({self.break_even_tokens / self.prompt_tokens:.1%}) |"
        )


def measure_length(loaded: "LoadedModel", length: int, loads: int) -> SnapshotLoadRow:
    """Prefill, write and load one prompt's snapshot."""
    from exo.worker.engines.mlx.cache.disk_tier import DiskTier
    from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
    from exo.worker.engines.mlx.generator.prefill import PiecePacer, PromptPrefill

    budget = 1 << 40
    model = loaded.model
    prompt = [(index * 37) % (loaded.vocabulary_size - 100) + 100 for index in range(length)]
    pieces: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as folder:

        def prefix_cache() -> PrefixCache:
            return PrefixCache(model, budget, DiskTier(Path(folder), budget, "bench", model, queue_budget_bytes=budget))

        first = prefix_cache()
        lease = first.acquire(prompt)
        started = time.perf_counter()
        pacer = PiecePacer(on_piece=lambda tokens, seconds: pieces.append((tokens, seconds)))
        prefill = PromptPrefill(model, lease.cache, lease.remaining_tokens, pacer)
        while not prefill.finished:
            prefill.step()
        prefill_seconds = time.perf_counter() - started
        first.release(lease, prefill.fed, cache=prefill.cache)
        while first.snapshots_pending:
            first.write_pending_snapshot()
        restarted = prefix_cache()
        for tokens, seconds in pieces:  # what the runner's scheduler would have told it
            restarted.prefilled(tokens, seconds)
        load_seconds: list[float] = []
        for _ in range(loads):
            started = time.perf_counter()
            leased = restarted.acquire(prompt)
            load_seconds.append(time.perf_counter() - started)
            if leased.disk_cached_tokens != length - 1:
                raise RuntimeError(f"the snapshot of {length} tokens was not loaded: {leased.disk_cached_tokens}")
            restarted.discard(leased)
        snapshot_bytes = restarted.disk.nbytes if restarted.disk is not None else 0
    rule = restarted.load_or_prefill
    if rule.prefill_seconds_per_token is None or rule.load_seconds_per_byte is None:
        raise RuntimeError(f"a prompt of {length} tokens left a cost unmeasured (too short for a measured piece?)")
    row = SnapshotLoadRow(
        prompt_tokens=length,
        snapshot_bytes=snapshot_bytes,
        cold_prefill_seconds=prefill_seconds,
        prefill_seconds_per_token=rule.prefill_seconds_per_token,
        load_seconds=load_seconds,
        load_seconds_per_byte=rule.load_seconds_per_byte,
    )
    print(f"{length} tokens: {row.markdown()}", file=sys.stderr)
    return row


if __name__ == "__main__":
    record_start_commit()
    main()
