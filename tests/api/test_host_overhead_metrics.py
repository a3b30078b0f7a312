"""The host-overhead meter on a real node: after requests alone, under a grammar and batched, /metrics carries the
decode-step times by requests decoding, and they add up (device wait, prefill and the host's parts within the steps'
wall time, each part nonzero where its work happened; the work done beside the loop apart)."""

import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exo.worker.engines.mlx.generator.beside import launch_computes_on_host
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.endless_model import MODEL as ENDLESS
from tests.fixtures.endless_model import endless_copy
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL, user

MODEL = "tiny-qwen-tools"
CONCURRENT = 3
CONCURRENT_TOKENS = 1500
"""The endless model decodes to max_tokens, so requests sent at once overlap unless one finishes before the next is
admitted: at 150 tokens a fast moment once let the first end (a tiny model decodes a token in about a millisecond)
before the others reached the runner; 1,500 leave them seconds (the context is widened to hold them)."""
METRICS_WITHIN_S = 30.0
MANY_STEPS = 100
"""Enough steps that some were chained or batched (their tokens accepted beside the launch, where it computes on the
host)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    models = [fixture_model(MODEL), endless_copy(tmp_path_factory.mktemp("endless"), context_length=1 << 12)]
    with running_exo(models, tmp_path_factory.mktemp("host-overhead")) as running:
        yield running


def _complete(base_url: str, body: Mapping[str, object], model: str = MODEL) -> None:
    response = httpx.post(f"{base_url}/v1/chat/completions", json={"model": model, **body}, timeout=120)
    assert response.status_code == 200, response.text


def _step_series(base_url: str, model: str) -> dict[tuple[str, str, str], float]:
    """(metric, streams, part) -> value for `model`'s decode-step series ("" where a series has no part)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    series: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            named = sample.name.startswith("exo_decode_step") and sample.name.endswith("_total")
            if named and sample.labels["model"] == model:
                series[(sample.name, sample.labels["streams"], sample.labels.get("part", ""))] = sample.value
    return series


@pytest.mark.slow
def test_metrics_split_decode_steps_into_device_wait_and_host_parts(server: ExoServer) -> None:
    base_url = server.base_url
    _complete(base_url, {"messages": [user("Hello!")], "max_tokens": 24})
    _complete(
        base_url,
        {
            "messages": [user("What is the weather in Paris?")],
            "tools": [GET_WEATHER_TOOL],
            "tool_choice": "required",
            "max_tokens": 24,
        },
    )
    with ThreadPoolExecutor(CONCURRENT) as pool:
        bodies = [{"messages": [user(f"Hello! Count to {n}.")], "max_tokens": CONCURRENT_TOKENS} for n in range(3)]
        for future in [pool.submit(_complete, base_url, body, ENDLESS) for body in bodies]:
            future.result()

    deadline = time.monotonic() + METRICS_WITHIN_S
    alone: dict[tuple[str, str, str], float] = {}
    batched: dict[tuple[str, str, str], float] = {}
    while time.monotonic() < deadline:
        alone, batched = _step_series(base_url, MODEL), _step_series(base_url, ENDLESS)
        if any(streams != "1" for (_, streams, _) in batched) and ("exo_decode_steps_total", "1", "") in alone:
            break
        time.sleep(0.5)
    assert ("exo_decode_steps_total", "1", "") in alone, f"steps alone, got {sorted(alone)}"
    assert any(streams != "1" for (_, streams, _) in batched), f"batched steps, got {sorted(batched)}"
    _assert_plausible(alone)
    _assert_plausible(batched)
    processors = alone.get(("exo_decode_step_host_seconds_total", "1", "processors"), 0.0)
    assert processors > 0, "the tool_choice-required request ran its grammar's masks in steps alone"
    # Prompt pieces by prompts fed together: the two requests sent one after the other were each fed alone; the
    # three sent at once fed each of their prompts at least once (together or not, as they reached the runner).
    alone_pieces, batched_pieces = _prefill_pieces(base_url, MODEL), _prefill_pieces(base_url, ENDLESS)
    assert alone_pieces.get(1, 0) >= 2, alone_pieces
    assert set(alone_pieces) == {1}, alone_pieces
    assert sum(prompts * pieces for prompts, pieces in batched_pieces.items()) >= CONCURRENT, batched_pieces
    assert max(batched_pieces) <= CONCURRENT, batched_pieces


def _prefill_pieces(base_url: str, model: str) -> dict[int, float]:
    """Prompts fed together -> prompt pieces, for `model`."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    pieces: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "exo_prefill_pieces_total" and sample.labels["model"] == model:
                pieces[int(sample.labels["prompts"])] = sample.value
    return pieces


def _assert_plausible(series: dict[tuple[str, str, str], float]) -> None:
    for streams in sorted({streams for (_, streams, _) in series}, key=int):
        steps = series[("exo_decode_steps_total", streams, "")]
        wall = series[("exo_decode_step_seconds_total", streams, "")]
        device = series[("exo_decode_step_device_seconds_total", streams, "")]
        prefill = series[("exo_decode_step_prefill_seconds_total", streams, "")]
        host = {
            part: value
            for (name, s, part), value in series.items()
            if name.endswith("host_seconds_total") and s == streams
        }
        assert steps >= 1
        assert device > 0, f"{streams} streams: every decode step waits for the model"
        assert device + prefill + sum(host.values()) <= wall * 1.001 + 1e-6, f"{streams} streams: parts exceed steps"
        assert sum(host.values()) >= 0.0
        beside = series[("exo_decode_step_beside_seconds_total", streams, "")]
        for part in ("graph", "parse", "send", "loop"):
            assert host.get(part, 0.0) > 0, f"{streams} streams: no time in {part} ({host})"
        # Detokenizing runs in the loop, or beside the next launch where that computes on the host (`beside.py`).
        assert host.get("detokenize", 0.0) + beside > 0, f"{streams} streams: no time detokenizing ({host})"
        assert beside <= wall, f"{streams} streams: more work beside the steps than the steps took"
        if steps >= MANY_STEPS:
            assert (beside > 0) == launch_computes_on_host(), f"{streams} streams: {beside} s beside the loop"
        # Every part of a step is a share of a real step: none alone takes longer than the steps themselves.
        assert all(value <= wall for value in host.values())
