"""GET /metrics: the cluster state in Prometheus text format, labelled by node, model and runner.

Any node answers for the whole cluster (its state is the cluster's), so one scrape target is enough; scraping
every node gives the same series.
"""

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from exo.shared.types.state import RunnerInfo, State

PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_LATEST


def prometheus_text(state: State, cluster: str) -> bytes:
    """The exposition text for `state`."""
    return generate_latest(_StateCollector(state, cluster))


class _StateCollector:
    def __init__(self, state: State, cluster: str) -> None:
        self._state = state
        self._cluster = cluster

    def collect(self) -> Iterator[Metric]:
        yield from self._node_metrics()
        yield from self._model_metrics()
        index = GaugeMetricFamily("exo_event_log_index", "Index of the last event applied", labels=["cluster"])
        index.add_metric([self._cluster], self._state.last_event_index)
        yield index

    def _node_metrics(self) -> Iterator[Metric]:
        labels = ["cluster", "node_id", "node_name"]
        up = GaugeMetricFamily("exo_node_up", "1 while the node is in the cluster", labels=labels)
        degraded = GaugeMetricFamily("exo_node_degraded", "1 while the node is degraded", labels=labels)
        master = GaugeMetricFamily("exo_node_master", "1 for the elected master", labels=labels)
        total = GaugeMetricFamily("exo_node_memory_total_bytes", "Memory installed", labels=labels)
        available = GaugeMetricFamily("exo_node_memory_available_bytes", "Memory available", labels=labels)
        seen = GaugeMetricFamily("exo_node_last_seen_timestamp_seconds", "Last report from the node", labels=labels)
        dropped = CounterMetricFamily(
            "exo_node_dropped_messages", "Invalid or forged messages from the network the node dropped", labels=labels
        )
        for node in self._state.nodes.values():
            values = [self._cluster, node.facts.node_id, node.facts.name]
            up.add_metric(values, node.health.status != "down")
            degraded.add_metric(values, node.health.status == "degraded")
            master.add_metric(values, self._state.master_node_id == node.facts.node_id)
            total.add_metric(values, node.facts.memory.total_bytes)
            available.add_metric(values, node.facts.memory.available_bytes)
            seen.add_metric(values, node.last_seen)
            dropped.add_metric(values, node.facts.dropped_messages)
        yield from (up, degraded, master, total, available, seen, dropped)

    def _model_metrics(self) -> Iterator[Metric]:
        labels = ["cluster", "node_id", "model", "runner_id"]
        requests = CounterMetricFamily(
            "exo_requests", "Requests that left a runner, by outcome", labels=[*labels, "outcome"]
        )
        prompt = CounterMetricFamily("exo_prompt_tokens", "Prompt tokens processed", labels=labels)
        generated = CounterMetricFamily("exo_generated_tokens", "Tokens generated", labels=labels)
        first_token = GaugeMetricFamily(
            "exo_time_to_first_token_seconds", "Mean time to first token over recent requests", labels=labels
        )
        decode = GaugeMetricFamily(
            "exo_decode_tokens_per_second", "Mean decode speed over recent requests", labels=labels
        )
        tasks = GaugeMetricFamily("exo_tasks", "Tasks held by runners, by status", labels=[*labels, "status"])
        ggml_threads = GaugeMetricFamily(
            "exo_ggml_threads",
            "ggml's thread count at the runner's last finished task (q8_0/gguf weights on a CPU: the cores other "
            "processes leave)",
            labels=labels,
        )
        repeated = CounterMetricFamily(
            "exo_repeated_tool_calls",
            "Calls identical to one the previous assistant turn made, since the user last spoke (agent-loop guard)",
            labels=labels,
        )
        withdrawn = CounterMetricFamily(
            "exo_withdrawn_tool_calls",
            "Real loops the agent-loop guard took back (block, answer): the third identical call in a row after "
            "identical results, or the fifth after the same error result four times",
            labels=labels,
        )
        for runner in sorted(self._state.runners.values(), key=lambda runner: runner.runner_id):
            values = [self._cluster, runner.node_id, runner.model_id, runner.runner_id]
            metrics = runner.metrics
            requests.add_metric([*values, "finished"], metrics.requests_finished)
            requests.add_metric([*values, "failed"], metrics.requests_failed)
            requests.add_metric([*values, "cancelled"], metrics.requests_cancelled)
            prompt.add_metric(values, metrics.prompt_tokens)
            generated.add_metric(values, metrics.generated_tokens)
            repeated.add_metric(values, metrics.repeated_tool_calls)
            withdrawn.add_metric(values, metrics.withdrawn_tool_calls)
            if metrics.time_to_first_token_seconds is not None:
                first_token.add_metric(values, metrics.time_to_first_token_seconds)
            if metrics.decode_tokens_per_second is not None:
                decode.add_metric(values, metrics.decode_tokens_per_second)
            if runner.ggml_threads is not None:
                ggml_threads.add_metric(values, runner.ggml_threads)
            for status in ("queued", "running"):
                tasks.add_metric([*values, status], self._task_count(runner, status))
        yield from (requests, prompt, generated, first_token, decode, tasks, repeated, withdrawn, ggml_threads)
        yield from self._memory_metrics()
        yield from self._step_metrics()

    def _memory_metrics(self) -> Iterator[Metric]:
        """Each runner's memory: its resident size measured from outside, and its own account of what it holds."""
        labels = ["cluster", "node_id", "model", "runner_id"]
        resident = GaugeMetricFamily(
            "exo_runner_resident_bytes",
            "The runner process's resident set size, as its node last reported (every few seconds)",
            labels=labels,
        )
        active = GaugeMetricFamily(
            "exo_runner_mlx_active_bytes",
            "Bytes of arrays mlx holds in the runner (weights mlx loaded, KV caches; on a GPU its device memory), "
            "as of the last task it ended or its last turn to idle",
            labels=labels,
        )
        cached = GaugeMetricFamily(
            "exo_runner_mlx_cache_bytes",
            "Bytes mlx keeps of freed arrays for reuse (emptied as the runner turns idle), as of the same moment",
            labels=labels,
        )
        prefix_bytes = GaugeMetricFamily(
            "exo_prefix_cache_bytes",
            "KV bytes the prefix cache holds, by tier: memory, queued (disk snapshots held in memory until they are "
            "written; one the memory tier still keeps counts in both) and disk",
            labels=[*labels, "tier"],
        )
        prefix_entries = GaugeMetricFamily(
            "exo_prefix_cache_entries", "Prompt caches the prefix cache holds, by tier", labels=[*labels, "tier"]
        )
        snapshots = CounterMetricFamily(
            "exo_prefix_cache_snapshots",
            "Disk snapshots since the runner started, by outcome: written, dropped unwritten from a full queue "
            "(sessions ending faster than they are written), loaded for a prompt, or passed_over (prefilling what "
            "they held beyond memory was measured to cost less than loading them, or, before both costs were "
            "measured, was under 32 tokens)",
            labels=[*labels, "outcome"],
        )
        prefill_cost = GaugeMetricFamily(
            "exo_prefix_cache_prefill_seconds_per_token",
            "The runner's running average of a prompt token's prefill (pieces of 32 tokens or more): what a disk "
            "snapshot's load is weighed against",
            labels=labels,
        )
        load_cost = GaugeMetricFamily(
            "exo_prefix_cache_load_seconds_per_byte",
            "The runner's running average of a byte of disk snapshot loaded (read, checked and parsed)",
            labels=labels,
        )
        for runner in sorted(self._state.runners.values(), key=lambda runner: runner.runner_id):
            values = [self._cluster, runner.node_id, runner.model_id, runner.runner_id]
            if runner.resident_bytes is not None:
                resident.add_metric(values, runner.resident_bytes)
            if runner.memory is None:
                continue
            active.add_metric(values, runner.memory.mlx_active_bytes)
            cached.add_metric(values, runner.memory.mlx_cache_bytes)
            if (usage := runner.memory.prefix_cache) is not None:
                prefix_bytes.add_metric([*values, "memory"], usage.memory_bytes)
                prefix_bytes.add_metric([*values, "queued"], usage.queued_bytes)
                prefix_bytes.add_metric([*values, "disk"], usage.disk_bytes)
                prefix_entries.add_metric([*values, "memory"], usage.memory_entries)
                prefix_entries.add_metric([*values, "disk"], usage.disk_entries)
                snapshots.add_metric([*values, "written"], usage.snapshots_written)
                snapshots.add_metric([*values, "dropped"], usage.snapshots_dropped)
                snapshots.add_metric([*values, "loaded"], usage.snapshots_loaded)
                snapshots.add_metric([*values, "passed_over"], usage.snapshots_passed_over)
                if usage.prefill_seconds_per_token is not None:
                    prefill_cost.add_metric(values, usage.prefill_seconds_per_token)
                if usage.load_seconds_per_byte is not None:
                    load_cost.add_metric(values, usage.load_seconds_per_byte)
        yield from (resident, active, cached, prefix_bytes, prefix_entries, snapshots, prefill_cost, load_cost)

    def _step_metrics(self) -> Iterator[Metric]:
        """The host-overhead meter: decode-step time totals by requests decoding in the step, so a rate over a
        window gives seconds per step (and, divided by `streams`, per stream)."""
        labels = ["cluster", "node_id", "model", "runner_id", "streams"]
        steps = CounterMetricFamily("exo_decode_steps", "Decode steps taken, by requests decoding", labels=labels)
        wall = CounterMetricFamily(
            "exo_decode_step_seconds", "Wall time of those decode steps (all parts below together)", labels=labels
        )
        device = CounterMetricFamily(
            "exo_decode_step_device_seconds",
            "Time in those steps the runner waited for the model's evaluation",
            labels=labels,
        )
        prefill = CounterMetricFamily(
            "exo_decode_step_prefill_seconds", "Time in those steps feeding other requests' prompts", labels=labels
        )
        beside = CounterMetricFamily(
            "exo_decode_step_beside_seconds",
            "Work a helper thread did for those steps while the runner's loop went on (their tokens accepted beside "
            "the next launch): not host time on the loop's critical path",
            labels=labels,
        )
        host = CounterMetricFamily(
            "exo_decode_step_host_seconds",
            "Host overhead in those steps (the rest of their time), by part: messages, admit, graph (building the "
            "forward pass in Python), launch (mx.async_eval), "
            "processors (grammar masks, penalties), detokenize, parse (tool calls, reasoning, stops), send (runner to "
            "API), loop",
            labels=[*labels, "part"],
        )
        for runner in sorted(self._state.runners.values(), key=lambda runner: runner.runner_id):
            for streams, times in sorted(runner.step_times.items()):
                values = [self._cluster, runner.node_id, runner.model_id, runner.runner_id, str(streams)]
                steps.add_metric(values, times.steps)
                wall.add_metric(values, times.step_seconds)
                device.add_metric(values, times.device_seconds)
                prefill.add_metric(values, times.prefill_seconds)
                beside.add_metric(values, times.beside_seconds)
                for part, seconds in sorted(times.host_seconds.items()):
                    host.add_metric([*values, part], seconds)
        yield from (steps, wall, device, prefill, beside, host)
        yield self._prefill_group_metric()

    def _prefill_group_metric(self) -> Metric:
        """Prompt pieces prefilled, by how many prompts each fed in one pass: requests sent together should show up
        under `prompts` above 1 (fed together), not as many pieces of 1."""
        labels = ["cluster", "node_id", "model", "runner_id", "prompts"]
        pieces = CounterMetricFamily(
            "exo_prefill_pieces",
            "Prompt pieces prefilled, by how many prompts each one fed together (1: a prompt alone)",
            labels=labels,
        )
        for runner in sorted(self._state.runners.values(), key=lambda runner: runner.runner_id):
            for prompts, count in sorted(runner.prefill_pieces.items()):
                pieces.add_metric(
                    [self._cluster, runner.node_id, runner.model_id, runner.runner_id, str(prompts)], count
                )
        return pieces

    def _task_count(self, runner: RunnerInfo, status: str) -> int:
        return sum(task.runner_id == runner.runner_id and task.status == status for task in self._state.tasks.values())
