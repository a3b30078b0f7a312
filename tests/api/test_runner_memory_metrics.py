"""A node's /metrics carries each runner's memory: its resident size and its own account (mlx's arrays, the prefix
cache's tiers), so an operator sees a runner grow under load. On a real node: after a long prompt the memory tier
holds it and, once the runner is idle, the disk tier too."""

import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import user

MODEL = "tiny-qwen-tools"
SYSTEM_PROMPT = "You are a careful coding agent. Follow the rules of the repository. " * 30
"""Over 256 tokens: long enough for a disk snapshot."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(MODEL)], tmp_path_factory.mktemp("runner-memory")) as running:
        yield running


def _memory_series(base_url: str) -> dict[tuple[str, str], float]:
    """(metric, tier) -> value for the model's runner memory series ("" where a series has no tier)."""
    series: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=10).text):
        for sample in family.samples:
            memory = sample.name.startswith(("exo_runner_", "exo_prefix_cache_"))
            if memory and sample.labels["model"] == MODEL:
                series[(sample.name, sample.labels.get("tier", sample.labels.get("outcome", "")))] = sample.value
    return series


def test_metrics_show_the_runners_memory_and_its_prefix_cache_tiers(server: ExoServer) -> None:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, user("Hello!")]
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 8},
        timeout=120,
    )
    assert response.status_code == 200, response.text

    deadline = time.monotonic() + 30  # the snapshot is written beside the runner's loop, then reported
    series = _memory_series(server.base_url)
    while series.get(("exo_prefix_cache_entries", "disk")) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        series = _memory_series(server.base_url)

    assert series[("exo_prefix_cache_entries", "disk")] == 1
    assert series[("exo_prefix_cache_entries", "memory")] == 1
    assert series[("exo_prefix_cache_bytes", "memory")] > 0
    assert series[("exo_prefix_cache_bytes", "disk")] > 0
    assert series[("exo_prefix_cache_bytes", "queued")] == 0
    assert series[("exo_prefix_cache_snapshots_total", "written")] == 1
    assert series[("exo_prefix_cache_snapshots_total", "dropped")] == 0
    # The disk held nothing when the prompt came: no snapshot was loaded or weighed against its prefill.
    assert series[("exo_prefix_cache_snapshots_total", "loaded")] == 0
    assert series[("exo_prefix_cache_snapshots_total", "passed_over")] == 0
    # The long prompt's prefill was measured, what a later snapshot's load is weighed against; no load yet.
    assert 0 < series[("exo_prefix_cache_prefill_seconds_per_token", "")] < 1
    assert ("exo_prefix_cache_load_seconds_per_byte", "") not in series
    assert series[("exo_runner_mlx_active_bytes", "")] > 0
    assert series[("exo_runner_resident_bytes", "")] > series[("exo_runner_mlx_active_bytes", "")]
    runner = next(iter(httpx.get(f"{server.base_url}/state", timeout=10).json()["runners"].values()))
    assert runner["resident_bytes"] > 0
    assert runner["memory"]["prefix_cache"]["disk_entries"] == 1
