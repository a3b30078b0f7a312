"""The /v1/cluster views and the Prometheus text, computed from a state built event by event."""

from prometheus_client.parser import text_string_to_metric_families

from exo.api.cluster_views import cluster_metrics, cluster_nodes, cluster_summary
from exo.api.prometheus import prometheus_text
from exo.shared.types.events import MasterElected, NodeDown, TaskUpdated
from exo.shared.types.state import RunnerMetrics, State
from exo.shared.types.worker.runner_response import PrefixCacheUsage, RunnerMemory
from tests.shared.state_builders import GIB, NODE_A, NODE_B, NODE_C, fold, reported, runner, task

A_METRICS = RunnerMetrics(
    requests_finished=3,
    requests_failed=1,
    prompt_tokens=300,
    generated_tokens=60,
    time_to_first_token_seconds=0.2,
    decode_tokens_per_second=40.0,
    repeated_tool_calls=4,
    withdrawn_tool_calls=3,
)
B_METRICS = RunnerMetrics(
    requests_finished=1, generated_tokens=10, time_to_first_token_seconds=0.6, decode_tokens_per_second=20.0
)


def three_node_state() -> State:
    """A (master) serves model-x, B serves model-x and model-y, C left the cluster."""
    on_a = runner("ra", NODE_A, metrics=A_METRICS)
    on_b = runner("rb", NODE_B, metrics=B_METRICS)
    other = runner("ry", NODE_B, "model-y", status="loading")
    return fold(
        (MasterElected(node_id=NODE_A), NODE_A),
        (reported(NODE_A, on_a, tasks=(task("t1", on_a, status="running"), task("t2", on_a))), NODE_A),
        (reported(NODE_B, on_b, other, available_gib=2, cpu_weights="int8"), NODE_B),
        (reported(NODE_C), NODE_C),
        (NodeDown(node_id=NODE_C, reason="left the cluster"), NODE_A),
        (TaskUpdated(task=task("t3", on_b, requested_by=NODE_A)), NODE_B),
    )


def test_the_summary_counts_nodes_and_memory_and_lists_where_models_run() -> None:
    summary = cluster_summary(three_node_state(), "lab", NODE_B)
    assert (summary.cluster, summary.node_id, summary.master_node_id) == ("lab", NODE_B, NODE_A)
    assert (summary.nodes_healthy, summary.nodes_degraded, summary.nodes_down) == (2, 0, 1)
    assert summary.memory_total_bytes == 32 * GIB  # the node that left no longer counts
    assert summary.memory_available_bytes == 10 * GIB
    assert [model.model_id for model in summary.models] == ["model-x", "model-y"]
    assert [(instance.runner_id, instance.node_id) for instance in summary.models[0].instances] == [
        ("ra", NODE_A),
        ("rb", NODE_B),
    ]
    assert summary.models[1].instances[0].status == "loading"
    assert summary.last_event_index == 6


def test_nodes_list_every_node_with_health_role_and_its_own_models() -> None:
    nodes = {node.node_id: node for node in cluster_nodes(three_node_state())}
    assert set(nodes) == {NODE_A, NODE_B, NODE_C}
    assert nodes[NODE_A].is_master
    assert not nodes[NODE_B].is_master
    assert (nodes[NODE_C].status, nodes[NODE_C].reason) == ("down", "left the cluster")
    assert nodes[NODE_C].models == []
    assert [model.model_id for model in nodes[NODE_B].models] == ["model-x", "model-y"]
    assert nodes[NODE_B].memory_available_bytes == 2 * GIB
    assert nodes[NODE_A].cluster_endpoints == ["tcp/10.0.0.97:52414"]
    # What placement plans each node's memory with (the dashboard's node cards show it).
    assert (nodes[NODE_A].weights_in_memory, nodes[NODE_B].weights_in_memory) == ("float32", "int8")


def test_metrics_add_counters_weight_timings_by_requests_and_count_queues() -> None:
    metrics = cluster_metrics(three_node_state())
    model_x = next(model for model in metrics.models if model.model_id == "model-x")
    assert model_x.node_ids == [NODE_A, NODE_B]
    assert (model_x.requests_finished, model_x.requests_failed, model_x.generated_tokens) == (4, 1, 70)
    assert model_x.time_to_first_token_seconds is not None
    assert abs(model_x.time_to_first_token_seconds - (3 * 0.2 + 1 * 0.6) / 4) < 1e-9
    assert model_x.decode_tokens_per_second == (3 * 40.0 + 1 * 20.0) / 4
    assert (model_x.tasks_running, model_x.queue_depth) == (1, 2)
    node_a = next(node for node in metrics.nodes if node.node_id == NODE_A)
    assert (node_a.tasks_running, node_a.queue_depth, node_a.requests_finished) == (1, 1, 3)
    model_y = next(model for model in metrics.models if model.model_id == "model-y")
    assert model_y.time_to_first_token_seconds is None


def test_prometheus_text_parses_and_carries_the_same_figures() -> None:
    families = {
        family.name: family
        for family in text_string_to_metric_families(prometheus_text(three_node_state(), "lab").decode())
    }
    up = {sample.labels["node_id"]: sample.value for sample in families["exo_node_up"].samples}
    assert up == {NODE_A: 1.0, NODE_B: 1.0, NODE_C: 0.0}
    master = {sample.labels["node_id"]: sample.value for sample in families["exo_node_master"].samples}
    assert master[NODE_A] == 1.0
    finished = [
        sample
        for sample in families["exo_requests"].samples
        if sample.labels["outcome"] == "finished" and sample.labels["runner_id"] == "ra"
    ]
    assert [(sample.name, sample.value, sample.labels["model"]) for sample in finished] == [
        ("exo_requests_total", 3.0, "model-x")
    ]
    queued = {
        (sample.labels["runner_id"], sample.labels["status"]): sample.value for sample in families["exo_tasks"].samples
    }
    assert queued[("ra", "queued")] == 1.0
    assert queued[("ra", "running")] == 1.0
    assert families["exo_event_log_index"].samples[0].value == 6.0
    for family, value in (("exo_repeated_tool_calls", 4.0), ("exo_withdrawn_tool_calls", 3.0)):
        by_runner = {sample.labels["runner_id"]: sample.value for sample in families[family].samples}
        assert (by_runner["ra"], by_runner["rb"]) == (value, 0.0)


def test_prometheus_carries_ggml_threads_where_a_runner_reported_them() -> None:
    on_a = runner("ra", NODE_A).model_copy(update={"ggml_threads": 1})
    on_b = runner("rb", NODE_B)
    state = fold((reported(NODE_A, on_a), NODE_A), (reported(NODE_B, on_b), NODE_B))
    families = {
        family.name: family for family in text_string_to_metric_families(prometheus_text(state, "lab").decode())
    }
    threads = {sample.labels["runner_id"]: sample.value for sample in families["exo_ggml_threads"].samples}
    assert threads == {"ra": 1.0}  # rb runs no ggml products: no sample


def test_prometheus_carries_each_runners_memory_where_it_was_reported() -> None:
    usage = PrefixCacheUsage(
        memory_bytes=300,
        memory_entries=2,
        queued_bytes=100,
        disk_bytes=900,
        disk_entries=3,
        snapshots_written=7,
        snapshots_dropped=2,
        snapshots_loaded=4,
        snapshots_passed_over=1,
        prefill_seconds_per_token=0.012,
    )
    memory = RunnerMemory(mlx_active_bytes=5000, mlx_cache_bytes=70, prefix_cache=usage)
    on_a = runner("ra", NODE_A).model_copy(update={"resident_bytes": 8000, "memory": memory})
    without_cache = RunnerMemory(mlx_active_bytes=4000, mlx_cache_bytes=0)
    on_b = runner("rb", NODE_B).model_copy(update={"resident_bytes": 6000, "memory": without_cache})
    loading = runner("rc", NODE_B, "model-y", status="loading")
    state = fold((reported(NODE_A, on_a), NODE_A), (reported(NODE_B, on_b, loading), NODE_B))
    families = {
        family.name: family for family in text_string_to_metric_families(prometheus_text(state, "lab").decode())
    }

    def by_runner(family: str) -> dict[str, float]:
        return {sample.labels["runner_id"]: sample.value for sample in families[family].samples}

    assert by_runner("exo_runner_resident_bytes") == {"ra": 8000.0, "rb": 6000.0}  # rc reported nothing yet
    assert by_runner("exo_runner_mlx_active_bytes") == {"ra": 5000.0, "rb": 4000.0}
    assert by_runner("exo_runner_mlx_cache_bytes") == {"ra": 70.0, "rb": 0.0}
    tiers = {
        (sample.name, sample.labels["runner_id"], sample.labels["tier"]): sample.value
        for name in ("exo_prefix_cache_bytes", "exo_prefix_cache_entries")
        for sample in families[name].samples
    }
    assert tiers == {  # rb keeps no prefix cache: no series rather than zeros
        ("exo_prefix_cache_bytes", "ra", "memory"): 300.0,
        ("exo_prefix_cache_bytes", "ra", "queued"): 100.0,
        ("exo_prefix_cache_bytes", "ra", "disk"): 900.0,
        ("exo_prefix_cache_entries", "ra", "memory"): 2.0,
        ("exo_prefix_cache_entries", "ra", "disk"): 3.0,
    }
    outcomes = {
        (sample.labels["runner_id"], sample.labels["outcome"]): sample.value
        for sample in families["exo_prefix_cache_snapshots"].samples
    }
    assert outcomes == {
        ("ra", "written"): 7.0,
        ("ra", "dropped"): 2.0,
        ("ra", "loaded"): 4.0,
        ("ra", "passed_over"): 1.0,
    }
    assert by_runner("exo_prefix_cache_prefill_seconds_per_token") == {"ra": 0.012}
    assert by_runner("exo_prefix_cache_load_seconds_per_byte") == {}  # ra has loaded no snapshot: no sample
