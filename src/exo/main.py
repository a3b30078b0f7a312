"""The `exo` command: start a node (API + master + worker) serving an OpenAI-compatible API."""

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, get_args

import anyio
import uvicorn

from exo.api.message_count import DEFAULT_MAX_MESSAGES
from exo.api.read_timeouts import (
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_HEADER_TIMEOUT_SECONDS,
    read_timeout_protocol,
)
from exo.cluster.settings import (
    DEFAULT_CLUSTER_NAME,
    LOOPBACK_HOSTS,
    ClusterSettings,
    ClusterSettingsError,
    check_cluster_key,
    check_cluster_name,
    default_listen_endpoint,
    normalise_endpoint,
    parse_peer_list,
)
from exo.shared.types.cpu_kernels import DEFAULT_CPU_WEIGHTS, CpuWeightsSetting
from exo.shared.types.worker.decode_settings import DecodeSettings

# exo.node (and with it the model converter, transformers…) is imported only when a node starts: the subcommands
# (`exo models`, `exo conformance`, `exo mcp`, `exo launch`, `exo ggml`) start quickly without it.
if TYPE_CHECKING:
    from exo.node import Node, NodeConfig
    from exo.node_shutdown import NodeShutdown

logger = logging.getLogger("exo")


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a duration in seconds above zero."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exo",
        description="Run an exo node with an OpenAI-compatible API.",
        epilog="Other commands: `exo launch opencode|claude|codex` runs a coding agent against the node (exo launch "
        "--help); `exo mcp` serves exo's tools to agents over MCP (exo mcp --help); "
        "`exo conformance` checks the tool-call formats; `exo ggml build` builds ggml's CPU libraries for the "
        "quantized CPU path (exo ggml --help).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 exposes it)")
    parser.add_argument("--api-port", type=int, default=52415, help="API port (default 52415)")
    serving = parser.add_mutually_exclusive_group()
    serving.add_argument(
        "--model",
        action="append",
        help="model to load: a catalog id (`exo models` lists them), a local mlx-lm directory, a .gguf file or a "
        "Hugging Face repo id (repeatable; default: the bundled Qwen2.5-Coder-0.5B-Instruct)",
    )
    serving.add_argument(
        "--no-model",
        action="store_true",
        help="load no model here: the node lends its API and memory and serves the cluster's models",
    )
    parser.add_argument(
        "--min-nodes",
        type=_positive_int,
        default=1,
        help="split each model over at least this many nodes of the cluster (placed by free memory, as soon as "
        "that many are up); default 1: load it on this node",
    )
    parser.add_argument(
        "--parallel",
        choices=("pipeline", "tensor", "auto"),
        default="auto",
        help="how a model placed over several nodes (--min-nodes 2 or more) is split: by layers (pipeline), by "
        "matrices, every node running every layer with a share of its heads (tensor), or auto (the master's "
        "rule: the split with the least estimated time per token from the nodes' measured round trips and memory "
        "bandwidth; by layers until they are measured; docs/CLUSTER.md); default auto. It "
        "applies to every --model here; POST /v1/cluster/instances places one model with its own choice",
    )
    parser.add_argument(
        "--models-dir", type=Path, help="where downloaded/imported models live (default $EXO_HOME/models)"
    )
    parser.add_argument("--api-key", default=os.environ.get("EXO_API_KEY"), help="require 'Authorization: Bearer KEY'")
    parser.add_argument("--tool-format", help="override the tool-call format detected from the chat template")
    parser.add_argument("--queue-limit", type=int, default=64, help="requests waiting per model before 429")
    # Each decode flag's destination is a DecodeSettings field; a flag not given leaves the field's default.
    decoding = parser.add_argument_group("decoding", argument_default=argparse.SUPPRESS)
    decoding.add_argument(
        "--batch-size",
        type=_positive_int,
        help="requests per model decoded together, joining and leaving between tokens (default 8; 1 serves them one "
        "at a time)",
    )
    speculation = decoding.add_mutually_exclusive_group()
    speculation.add_argument(
        "--no-speculation",
        dest="speculation",
        action="store_false",
        help="turn off prompt-lookup speculative decoding (drafts copied from the conversation, checked by the model "
        "in one pass; a draft is verified only where the measured pass costs say it pays)",
    )
    speculation.add_argument("--speculation", action="store_true", help="keep speculation on (the default)")
    decoding.add_argument(
        "--no-auto-tool-grammar",
        dest="auto_tool_grammar",
        action="store_false",
        help='under tool_choice "auto", only parse and validate calls instead of holding a call the model opens to '
        "the tools' names and schemas with a grammar (a request's auto_tool_grammar field overrides this)",
    )
    decoding.add_argument(
        "--no-tool-call-repair",
        dest="tool_call_repair",
        action="store_false",
        help='under tool_choice "auto", return a call that no grammar held and that failed to parse or validate as '
        "the failure rule makes it instead of re-decoding it once under the grammar (a request's tool_call_repair "
        "field overrides this)",
    )
    decoding.add_argument(
        "--loop-guard",
        choices=("off", "warn", "block", "answer"),
        help="agent-loop guard for a call the model repeats although nothing changed: answer (default: the third "
        "identical call in a row since the user last spoke after two identical results that were no error, or the "
        "fifth after the same error result four times, is taken back and the reply decoded again without calls, so "
        "the model answers in text and an agent's loop ends), block (that call is taken back and the reply decoded "
        "again without its tool, so the model calls another or answers), warn (repeats reported from the second, in "
        "the response and /metrics only) or off; a request's loop_guard field or X-Exo-Loop-Guard header overrides "
        "it",
    )
    decoding.add_argument(
        "--prompt-layout",
        choices=("template", "tools-first"),
        help="where a request's tool definitions go in the prompt: tools-first (default: before the client's system "
        "text, where the template renders both in one turn and the move is exact, as Qwen's does; requests with the "
        "same tools then share them as a cached prefix whatever their system text, such as a project folder) or "
        "template (where the model's chat template puts them, for a model tuned on that exact order)",
    )
    decoding.add_argument(
        "--no-grammar-fast-forward",
        dest="grammar_fast_forward",
        action="store_false",
        help="decode the tokens a grammar forces (keys, punctuation, a tool's name) one forward pass each instead of "
        "feeding them as a draft verified in one pass (the output is the same either way; speculation must be on)",
    )
    decoding.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="launch a request's next decode step only after its last token was parsed and sent, instead of on the "
        "lazily sampled token before that work, so the host's work overlaps the next forward pass (the default; the "
        "output is the same either way), and compute a batch's grammar masks before its forward pass, not during it",
    )
    decoding.add_argument(
        "--no-accept-beside",
        dest="accept_beside",
        action="store_false",
        help="where the model runs on the CPU, accept a step's tokens (detokenize, parse tool calls, check stops) on "
        "the serving loop after launching the next step, instead of on a helper thread while it launches (the default; "
        "the output is the same either way)",
    )
    decoding.add_argument(
        "--no-matmul-plan",
        dest="matmul_plan",
        action="store_false",
        help="compute every float32 product in mlx's own layout; by default the runner times the few-row products of "
        "decoding in two layouts after loading (a second or two) and uses the faster one per weight shape",
    )
    parser.add_argument(
        "--cpu-kernels",
        choices=("auto", "off"),
        default="auto",
        help="the CPU engine's replacements of mlx/mlx-lm internals (float32 weights, numpy attention softmax and "
        "SwiGLU, the few-row matmul plan, an optimized BLAS preload): auto (default) uses them on a Linux CPU "
        "machine only; off serves with stock mlx-lm everywhere. The runner's ready line and /state say which are on",
    )
    parser.add_argument(
        "--cpu-weights",
        choices=get_args(CpuWeightsSetting),
        default=DEFAULT_CPU_WEIGHTS,
        help="what the CPU engine holds the weights as (under --cpu-kernels auto on a Linux CPU machine): auto "
        f"(default {DEFAULT_CPU_WEIGHTS}) is gguf for a model whose GGUF was kept at import, else q8_0, where ggml's "
        "CPU library is built (once: `uv run exo ggml build`), and float32 where it is not (the node says so at "
        "start); float32 expands every matrix for float32 BLAS; int8 keeps one byte a weight with a "
        "float32 scale per output row and multiplies with MKL's integer GEMM (a quarter of the memory); q8_0 keeps "
        "ggml's Q8_0 blocks (34 bytes per 32 weights) and multiplies with ggml's kernels, as llama.cpp does: it needs "
        "ggml's CPU library (`uv run exo ggml build`; the runner refuses to load without it); gguf serves the blocks "
        "of the GGUF the model was imported from as they are (Q4_K, Q5_0, Q6_K...: no re-quantization) through the "
        "same kernels: it needs ggml too, and a model imported with its GGUF kept (`exo models download ID --force` "
        "imports a catalog model again)",
    )
    parser.add_argument(
        "--prefix-cache-gb",
        type=float,
        default=2.0,
        help="memory budget of the prompt prefix cache",
    )
    parser.add_argument(
        "--prefix-cache-disk-gb",
        type=float,
        default=8.0,
        help="disk budget per model of KV snapshots of prompt prefixes under $EXO_HOME/prefix-cache (0: none)",
    )
    parser.add_argument("--max-request-mb", type=float, default=32.0, help="largest accepted request body")
    parser.add_argument(
        "--max-request-messages",
        type=int,
        default=DEFAULT_MAX_MESSAGES,
        help=f"most messages (or Responses input items) one request may hold (default {DEFAULT_MAX_MESSAGES})",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let models run their own Python code while loading (custom architectures/tokenizers); off by default",
    )
    parser.add_argument(
        "--header-timeout",
        type=positive_seconds,
        default=DEFAULT_HEADER_TIMEOUT_SECONDS,
        help=f"seconds a client has to send its request headers (default {DEFAULT_HEADER_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=positive_seconds,
        default=DEFAULT_BODY_TIMEOUT_SECONDS,
        help=f"seconds a request body may stall between reads (default {DEFAULT_BODY_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument(
        "--show-model-paths",
        action="store_true",
        help="show where models live on disk in API answers (/state, errors); they are always in the logs",
    )
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument(
        "--listen",
        help="cluster endpoint to listen on, tcp/HOST:PORT (default tcp/127.0.0.1:52414, "
        "or every interface when --host is not loopback)",
    )
    cluster.add_argument(
        "--peer",
        action="append",
        default=[],
        help="another node's cluster endpoint to connect to, tcp/HOST:PORT (repeatable; also EXO_PEERS, "
        "comma-separated)",
    )
    cluster.add_argument(
        "--cluster",
        default=DEFAULT_CLUSTER_NAME,
        help=f"cluster name: nodes with different names never merge (default {DEFAULT_CLUSTER_NAME!r})",
    )
    cluster.add_argument(
        "--no-discovery", action="store_true", help="do not look for nodes with multicast (use --peer instead)"
    )
    cluster.add_argument("--node-name", help="this node's name in /v1/cluster (default: the host name)")
    cluster.add_argument(
        "--cluster-key",
        help="a secret every node of the cluster is given (also EXO_CLUSTER_KEY; at least 16 characters, not blank: "
        "an empty one is refused): links are mutual TLS rooted in it, so nodes without it can neither join, publish "
        "nor read, and traffic is encrypted "
        "(default: none, the cluster port is open and plain TCP)",
    )
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    return parser


def cluster_settings_from_args(arguments: argparse.Namespace) -> ClusterSettings:
    """Raises ClusterSettingsError for a malformed endpoint, cluster name or cluster key."""
    listen: str | None = arguments.listen
    peers = [normalise_endpoint(peer) for peer in arguments.peer]
    peers += parse_peer_list(os.environ.get("EXO_PEERS", ""))
    # A key given at all is checked, an empty one included: an empty `--cluster-key "$KEY"` or EXO_CLUSTER_KEY= is
    # a key that went missing, and must not start an open cluster.
    flagged: str | None = arguments.cluster_key
    key = flagged if flagged is not None else os.environ.get("EXO_CLUSTER_KEY")
    return ClusterSettings(
        name=check_cluster_name(arguments.cluster),
        listen=(normalise_endpoint(listen) if listen else default_listen_endpoint(arguments.host),),
        peers=tuple(dict.fromkeys(peers)),
        discovery=not arguments.no_discovery,
        key=None if key is None else check_cluster_key(key),
    )


def decode_settings_from_args(arguments: argparse.Namespace) -> DecodeSettings:
    """The decode flags given, each under its DecodeSettings field's name; the fields of flags not given keep their
    defaults."""
    given = {name: value for name, value in vars(arguments).items() if name in DecodeSettings.model_fields}
    return DecodeSettings.model_validate(given)


def config_from_args(arguments: argparse.Namespace) -> "NodeConfig":
    from exo.node import NodeConfig

    level = logging.DEBUG if arguments.verbose else logging.WARNING if arguments.quiet else logging.INFO
    models: list[str] | None = arguments.model
    return NodeConfig(
        models=() if arguments.no_model else tuple(models) if models else (None,),
        models_dir=arguments.models_dir,
        host=arguments.host,
        api_port=arguments.api_port,
        api_key=arguments.api_key or None,
        queue_limit=arguments.queue_limit,
        decode=decode_settings_from_args(arguments),
        cpu_kernels=arguments.cpu_kernels,
        cpu_weights=arguments.cpu_weights,
        prefix_cache_bytes=int(arguments.prefix_cache_gb * 1024**3),
        prefix_cache_disk_bytes=int(arguments.prefix_cache_disk_gb * 1024**3),
        tool_format_override=arguments.tool_format,
        max_request_bytes=int(arguments.max_request_mb * 1024 * 1024),
        max_request_messages=arguments.max_request_messages,
        log_level=level,
        trust_remote_code=arguments.trust_remote_code,
        show_model_paths=arguments.show_model_paths,
        header_timeout_seconds=arguments.header_timeout,
        body_timeout_seconds=arguments.body_timeout,
        cluster=cluster_settings_from_args(arguments),
        node_name=arguments.node_name,
        min_nodes=arguments.min_nodes,
        parallel=arguments.parallel,
    )


async def serve(config: "NodeConfig") -> int | None:
    """Run the node until its API server stops; the signal that stopped it (Ctrl-C, SIGTERM), if one did."""
    from exo.node import Node
    from exo.node_shutdown import STOP_SIGNALS, NodeShutdown
    from exo.worker.engines.mlx.cpu.blas import blas_advice, blas_environment
    from exo.worker.engines.mlx.cpu.switch import why_off
    from exo.worker.engines.mlx.cpu.weights_choice import auto_fallback_note, node_weights

    if why_off(config.cpu_kernels) is None:
        # The runner subprocesses inherit this environment: the optimized BLAS must be preloaded before mlx loads.
        os.environ.update(blas_environment(os.environ))
        advice = blas_advice(os.environ)
        if advice:
            logger.warning(advice)
        weights_note = auto_fallback_note(config.cpu_weights, config.cpu_kernels)
        if weights_note is not None:
            logger.warning(weights_note)
        else:
            weights = node_weights(config.cpu_weights, config.cpu_kernels)
            held = "each model's kept GGUF, else Q8_0" if weights == "gguf_or_q8_0" else weights
            logger.info("CPU weights: %s (--cpu-weights %s)", held, config.cpu_weights)
    if config.host not in LOOPBACK_HOSTS and not config.api_key:
        logger.warning("listening on %s without an API key: anyone on the network can use this node", config.host)
    if config.cluster.reachable_from_network and config.cluster.key is None:
        logger.warning(
            "cluster port %s is open to the network and unauthenticated: run clusters on trusted networks only",
            ", ".join(config.cluster.listen),
        )
    if config.cluster.key is not None:
        logger.info("cluster links are mutual TLS with certificates from the cluster key (encrypted, members only)")
    node = Node(config)
    shutdown = NodeShutdown(node.kill_runners)
    # The node handles its stop signals from here on (node_shutdown.py): one that comes while it joins is acted on
    # once it serves, and a second one still works while it stops.
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        await node.join()
        async with anyio.create_task_group() as watching:
            watching.start_soon(shutdown.watch, signals)
            try:
                await _serve_api(node, config, shutdown)
            finally:
                # Also when serving failed: the runners stop and the node leaves the cluster (an open zenoh session
                # would keep the process from exiting).
                with anyio.CancelScope(shield=True):
                    await node.stop()
                watching.cancel_scope.cancel()
    return shutdown.signal_number


async def _serve_api(node: "Node", config: "NodeConfig", shutdown: "NodeShutdown") -> None:
    """Run the node's pieces and its API until a stop signal has stopped the API (or it stopped by itself)."""
    from exo.api.app import create_app
    from exo.node import api_settings
    from exo.node_shutdown import SERVER_BACKSTOP_SECONDS, SHUTDOWN_GRACE_SECONDS, NodeServer

    async with anyio.create_task_group() as task_group:
        node.start(task_group)
        server = NodeServer(
            uvicorn.Config(
                create_app(node.master_client, api_settings(config), node.publish_preparation),
                host=config.host,
                port=config.api_port,
                log_level="warning",
                access_log=False,
                http=read_timeout_protocol(config.header_timeout_seconds, config.body_timeout_seconds),
                # Only a backstop: the streams still running when the grace ends are ended with an error first.
                timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS + SERVER_BACKSTOP_SECONDS,
            )
        )
        task_group.start_soon(shutdown.stop_serving, server, node.master_client)
        logger.info("exo API on http://%s:%d/v1", config.host, config.api_port)
        await server.serve()
        task_group.cancel_scope.cancel()


def quiet_http_client_logs(level: int) -> None:
    """httpx logs every request at INFO: one line per model piece fetched. Keep them for -v only."""
    if level > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> None:
    command_line = list(sys.argv[1:] if argv is None else argv)
    if command_line[:1] == ["conformance"]:
        from exo.conformance.cli import main as conformance_main

        sys.exit(conformance_main(command_line[1:]))
    if command_line[:1] == ["models"]:
        from exo.models.cli import main as models_main
        from exo.worker.engines.mlx.cpu.weights_choice import auto_fallback_note, node_weights

        sys.exit(
            models_main(
                command_line[1:],
                lambda weights, kernels: (node_weights(weights, kernels), auto_fallback_note(weights, kernels)),
            )
        )
    if command_line[:1] == ["launch"]:
        from exo.launch.cli import main as launch_main

        sys.exit(launch_main(command_line[1:]))
    if command_line[:1] == ["mcp"]:
        from exo.mcp.cli import main as mcp_main

        sys.exit(mcp_main(command_line[1:]))
    if command_line[:1] == ["ggml"]:
        from exo.worker.engines.mlx.cpu.ggml_build import main as ggml_main

        sys.exit(ggml_main(command_line[1:]))
    parser = build_parser()
    arguments = parser.parse_args(command_line)
    try:
        config = config_from_args(arguments)
    except ClusterSettingsError as error:
        parser.error(str(error))
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_http_client_logs(config.log_level)
    from exo.cluster.identity import NodeIdentityError
    from exo.node import NodeStartError
    from exo.node_shutdown import exit_status

    try:
        stop_signal = anyio.run(serve, config)
    except KeyboardInterrupt:
        sys.exit(130)
    except (NodeStartError, NodeIdentityError) as error:
        logger.error("%s", error)
        sys.exit(1)
    sys.exit(exit_status(stop_signal))


if __name__ == "__main__":
    main()
