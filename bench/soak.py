"""`python -m bench.soak MODEL_DIR`: a node under a mixed load for a while, and what a long unattended run would hit.

A fresh exo node serves MODEL_DIR as shipped (`--cpu-weights auto`); `--base-url` points the load at a node that is
already running instead. CONCURRENCY clients draw requests from `soak_requests.MIX` for MINUTES: the four dialects
streamed and not, tools under every `tool_choice`, clients that hang up mid-stream or give up during a prefill,
prompts of a few thousand tokens, and bodies a client gets wrong. It reports, per kind, what broke the wire contract
(an anomaly), a fixed probe request's time to its first text or call, the node idle, before and after, the runners'
memory over the run (as the node's `/metrics` give it: resident size and the prefix cache's memory tier and queue of
disk snapshots), how long the node took to be idle again, and the node's own ERROR log lines. It exits
1 when any anomaly, ERROR line or unfinished task is left, so it doubles as a check.
"""

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from bench.machine import cpu_model, exo_commit, record_start_commit
from bench.servers import running_exo
from bench.soak_requests import CHAT_TOOLS, MIX, PROMPTS, Outcome, SoakKind, Target, send
from bench.stream_client import stream_chat

IDLE_TIMEOUT_S = 120.0
SNAPSHOTS_TIMEOUT_S = 600.0
"""How long the idle node may take to write the prefix cache's queued disk snapshots (up to its budget, 2 GB by
default: a minute or more on a slow disk)."""
IDLE_SETTLE_S = 5.0
CLIENT_TIMEOUT_S = 300.0


class KindTally(BaseModel):
    sent: int
    anomalies: int
    client_timeouts: int
    median_s: float
    max_s: float


class Probe(BaseModel):
    """The same streamed tool request, three times in turn, on an idle node: medians of the time to the first chunk
    with text or a tool call, and to the end."""

    ttft_s: float
    total_s: float


class SessionReuse(BaseModel):
    """The agent sessions' turns after their first: how much of their prompts the prefix cache gave."""

    turns: int
    prompt_tokens: int
    cached_tokens: int


class MemorySample(BaseModel):
    """The node's runners together, from its `/metrics`."""

    minute: float
    runner_rss_mb: float
    prefix_cache_mb: float = 0.0
    """The prefix cache's memory tier."""
    queued_mb: float = 0.0
    """Disk snapshots of the prefix cache held in memory until they are written."""
    disk_mb: float = 0.0
    """The prefix cache's snapshots on disk (written beside the load or once idle)."""
    idle: bool = False
    """Taken once the node had written its queued snapshots and been idle IDLE_SETTLE_S more (a runner turning idle
    hands freed memory back)."""


class SoakReport(BaseModel):
    model: str
    node: str
    """The node loaded: "a fresh node (its arguments)" or "the node at URL"."""
    commit: str
    machine: str
    started_utc: str
    minutes: float
    concurrency: int
    seed: int
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    kinds: dict[SoakKind, KindTally]
    anomalies: list[str]
    """The first 50, as `kind: what broke`."""
    probe_before: Probe
    probe_after: Probe
    memory: list[MemorySample]
    session_reuse: SessionReuse | None = None
    idle_after_s: float | None
    """Seconds from the load's end until no task ran or waited (None: not within IDLE_TIMEOUT_S)."""
    snapshots_written_after_s: float | None = None
    """Seconds from the load's end until the prefix cache's queued disk snapshots were written (None: not within
    SNAPSHOTS_TIMEOUT_S, or the node reports no prefix cache)."""
    log_errors: list[str]
    """The node's ERROR lines and tracebacks (only where this run started the node)."""

    @property
    def passed(self) -> bool:
        return not self.anomalies and self.idle_after_s is not None and not self.log_errors


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("model", type=Path, nargs="?", help="the model directory a fresh node serves")
    parser.add_argument("--base-url", help="load a running node instead (its first model)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument(
        "--node-arg",
        action="append",
        default=[],
        help="an argument for the node this run starts, e.g. --node-arg=--prefix-cache-gb=0.5 (repeatable)",
    )
    arguments = parser.parse_args()
    if (arguments.model is None) == (arguments.base_url is None):
        parser.error("give a MODEL_DIR or --base-url")
    record_start_commit()  # the code under load is the checkout's at the start, whatever is edited meanwhile
    with _node(arguments.model, arguments.base_url, arguments.node_arg) as node:
        report = asyncio.run(soak(node, arguments.minutes, arguments.concurrency, arguments.seed))
    if arguments.json:
        arguments.json.write_text(report.model_dump_json(indent=1))
    print(render(report))
    sys.exit(0 if report.passed else 1)


@dataclass(frozen=True)
class SoakedNode:
    base_url: str
    log_path: Path | None = None
    description: str = ""


@contextmanager
def _node(model: Path | None, base_url: str | None, node_arguments: list[str]) -> Generator[SoakedNode]:
    if base_url is not None:
        yield SoakedNode(base_url=base_url.rstrip("/"), description=f"the node at {base_url}")
        return
    assert model is not None
    flags = ["--cpu-weights", "auto", *node_arguments]
    with tempfile.TemporaryDirectory() as work_dir, running_exo(model, Path(work_dir), flags) as server:
        description = f"a fresh node ({' '.join(flags)})"
        yield SoakedNode(server.base_url, server.log_path, description)


async def soak(node: SoakedNode, minutes: float, concurrency: int, seed: int) -> SoakReport:
    base_url, log_path = node.base_url, node.log_path
    load_before = os.getloadavg()
    started = time.monotonic()
    started_utc = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    log_start = log_path.stat().st_size if log_path is not None else 0
    async with httpx.AsyncClient(base_url=base_url, timeout=CLIENT_TIMEOUT_S) as client:
        listed = (await client.get("/v1/models")).json()["data"][0]
        model = listed["id"]
        target = Target(model=model, context_length=listed["context_length"])
        probe_before = await _probe(client, base_url, model)
        outcomes: list[Outcome] = []
        memory: list[MemorySample] = []
        deadline = started + minutes * 60
        clients = [
            asyncio.create_task(_client(client, target, random.Random(seed + index), deadline, outcomes))
            for index in range(concurrency)
        ]
        while not all(task.done() for task in clients):
            memory += await _memory_sample(client, started)
            await asyncio.wait(clients, timeout=30)
        for task in clients:
            task.result()  # a client's own failure (not a reply's) surfaces here
        load_end = time.monotonic()
        idle_after_s = await _idle_after(client, load_end)
        memory += await _memory_sample(client, started)
        written_after_s = await _snapshots_written_after(client, started, load_end)
        await asyncio.sleep(IDLE_SETTLE_S)
        memory += await _memory_sample(client, started, idle=True)
        probe_after = await _probe(client, base_url, model)
    return SoakReport(
        model=model,
        node=node.description,
        commit=exo_commit(),
        machine=f"{cpu_model()}, {os.cpu_count()} cores",
        started_utc=started_utc,
        minutes=minutes,
        concurrency=concurrency,
        seed=seed,
        load_before=load_before,
        load_after=os.getloadavg(),
        kinds=_tally(outcomes),
        anomalies=[f"{outcome.kind}: {outcome.anomaly}" for outcome in outcomes if outcome.anomaly][:50],
        probe_before=probe_before,
        probe_after=probe_after,
        memory=memory,
        session_reuse=_session_reuse(outcomes),
        idle_after_s=idle_after_s,
        snapshots_written_after_s=written_after_s,
        log_errors=_log_errors(log_path, log_start),
    )


async def _client(
    client: httpx.AsyncClient, target: Target, rng: random.Random, deadline: float, outcomes: list[Outcome]
) -> None:
    """Every kind once (so a short run covers them all), then kinds drawn by their weight, until the deadline."""
    kinds = list(MIX)
    weights = [MIX[kind] for kind in kinds]
    first_round = rng.sample(kinds, len(kinds))
    while time.monotonic() < deadline:
        kind = first_round.pop() if first_round else rng.choices(kinds, weights)[0]
        outcomes.append(await send(kind, client, target, rng))


async def _probe(client: httpx.AsyncClient, base_url: str, model: str) -> Probe:
    """The probe request three times in turn, timed by the bench's stream client (first text or call, and end)."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "tools": CHAT_TOOLS,
        "stream": True,
        "max_tokens": 24,
    }
    measured = [(await stream_chat(client, base_url, body)).measurement for _ in range(3)]
    return Probe(
        ttft_s=round(statistics.median(run.ttft_s for run in measured), 3),
        total_s=round(statistics.median(run.total_s for run in measured), 3),
    )


async def _idle_after(client: httpx.AsyncClient, since: float) -> float | None:
    """Seconds until the node's `/metrics` count no task running or queued (None: not within IDLE_TIMEOUT_S)."""
    while time.monotonic() - since < IDLE_TIMEOUT_S:
        text = (await client.get("/metrics")).text
        busy = sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "exo_tasks"
            for sample in family.samples
            if sample.labels.get("status") in ("running", "queued")
        )
        if busy == 0:
            return round(time.monotonic() - since, 2)
        await asyncio.sleep(0.5)
    return None


async def _snapshots_written_after(client: httpx.AsyncClient, started: float, since: float) -> float | None:
    """Seconds until the node's `/metrics` show no disk snapshot queued (None: not within SNAPSHOTS_TIMEOUT_S)."""
    while time.monotonic() - since < SNAPSHOTS_TIMEOUT_S:
        sample = await _memory_sample(client, started)
        if sample and sample[0].queued_mb == 0:
            return round(time.monotonic() - since, 2)
        await asyncio.sleep(0.5)
    return None


async def _memory_sample(client: httpx.AsyncClient, started: float, *, idle: bool = False) -> list[MemorySample]:
    """The node's runners' memory as its `/metrics` give it (none before a runner reported it)."""
    totals: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families((await client.get("/metrics")).text):
        for sample in family.samples:
            if family.name in ("exo_runner_resident_bytes", "exo_prefix_cache_bytes"):
                key = (family.name, sample.labels.get("tier", ""))
                totals[key] = totals.get(key, 0.0) + sample.value
    resident = totals.get(("exo_runner_resident_bytes", ""))
    if resident is None:
        return []
    return [
        MemorySample(
            minute=round((time.monotonic() - started) / 60, 2),
            runner_rss_mb=_megabytes(resident),
            prefix_cache_mb=_megabytes(totals.get(("exo_prefix_cache_bytes", "memory"), 0.0)),
            queued_mb=_megabytes(totals.get(("exo_prefix_cache_bytes", "queued"), 0.0)),
            disk_mb=_megabytes(totals.get(("exo_prefix_cache_bytes", "disk"), 0.0)),
            idle=idle,
        )
    ]


def _megabytes(count: float) -> float:
    return round(count / 2**20, 1)


def _log_errors(log_path: Path | None, start: int) -> list[str]:
    if log_path is None:
        return []
    with log_path.open("rb") as log:
        log.seek(start)
        lines = log.read().decode(errors="replace").splitlines()
    return [line[:300] for line in lines if " ERROR " in line or line.startswith("Traceback")][:50]


def _session_reuse(outcomes: list[Outcome]) -> SessionReuse | None:
    sessions = [outcome for outcome in outcomes if outcome.later_turns]
    if not sessions:
        return None
    return SessionReuse(
        turns=sum(outcome.later_turns for outcome in sessions),
        prompt_tokens=sum(outcome.later_prompt_tokens for outcome in sessions),
        cached_tokens=sum(outcome.later_cached_tokens for outcome in sessions),
    )


def _tally(outcomes: list[Outcome]) -> dict[SoakKind, KindTally]:
    tallies: dict[SoakKind, KindTally] = {}
    for kind in MIX:
        mine = [outcome for outcome in outcomes if outcome.kind == kind]
        if not mine:
            continue
        seconds = [outcome.seconds for outcome in mine]
        tallies[kind] = KindTally(
            sent=len(mine),
            anomalies=sum(outcome.anomaly is not None for outcome in mine),
            client_timeouts=sum(outcome.client_timeout for outcome in mine),
            median_s=round(statistics.median(seconds), 3),
            max_s=round(max(seconds), 3),
        )
    return tallies


def render(report: SoakReport) -> str:
    memory = report.memory
    lines = [
        f"Soak: {report.model} on {report.node}, {report.minutes:g} min, "
        f"{report.concurrency} clients, seed {report.seed}; commit "
        f"{report.commit}, {report.machine}, started {report.started_utc}, load average "
        f"{report.load_before[0]:.2f} before, {report.load_after[0]:.2f} after.",
        "",
        "| Kind | Sent | Anomalies | Client timeouts | Median s | Max s |",
        "|---|---|---|---|---|---|",
        *(
            f"| {kind} | {tally.sent} | {tally.anomalies} | {tally.client_timeouts} | {tally.median_s:.2f} | "
            f"{tally.max_s:.2f} |"
            for kind, tally in report.kinds.items()
        ),
        "",
        f"- Probe on the idle node (time to first token / whole reply, s): before {report.probe_before.ttft_s:.3f} / "
        f"{report.probe_before.total_s:.3f}, after {report.probe_after.ttft_s:.3f} / {report.probe_after.total_s:.3f}.",
        "- Idle again after the load: "
        + (f"{report.idle_after_s:.2f} s." if report.idle_after_s is not None else f"not within {IDLE_TIMEOUT_S} s.")
        + " Its queued disk snapshots written: "
        + (
            f"{report.snapshots_written_after_s:.2f} s after the load."
            if report.snapshots_written_after_s is not None
            else f"not within {SNAPSHOTS_TIMEOUT_S:g} s."
        ),
    ]
    loaded = [sample for sample in memory if not sample.idle]
    if loaded:
        idle = [
            f", {sample.runner_rss_mb:.0f} {IDLE_SETTLE_S:g} s after its snapshots were written"
            for sample in memory
            if sample.idle
        ]
        lines.append(
            f"- Runner resident memory (MB): {loaded[0].runner_rss_mb:.0f} at minute {loaded[0].minute:g}, at most "
            f"{max(sample.runner_rss_mb for sample in loaded):.0f}, {loaded[-1].runner_rss_mb:.0f} at the load's end"
            + "".join(idle)
            + f"; the prefix cache at most {max(sample.prefix_cache_mb for sample in memory):.0f} in memory and "
            f"{max(sample.queued_mb for sample in memory):.0f} queued for disk"
            + "".join(f", {sample.queued_mb:.0f} queued at the end" for sample in memory if sample.idle)
            + f"; on disk {loaded[-1].disk_mb:.0f} at the load's end"
            + "".join(f", {sample.disk_mb:.0f} once idle" for sample in memory if sample.idle)
            + "."
        )
    if (reuse := report.session_reuse) is not None:
        lines.append(
            f"- Agent sessions' later turns: {reuse.turns}, {reuse.prompt_tokens} prompt tokens, "
            f"{reuse.cached_tokens} of them from the prefix cache ({reuse.cached_tokens / reuse.prompt_tokens:.0%})."
        )
    lines.append(f"- Node log: {len(report.log_errors)} ERROR line(s) or tracebacks.")
    lines += [f"  - {line}" for line in report.log_errors[:10]]
    lines += [f"- Anomaly: {anomaly}" for anomaly in report.anomalies[:20]]
    lines.append(f"- {'Passed' if report.passed else 'Failed'}.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
