"""Where one one-row decode step's wall time goes on the quantized CPU paths (`--cpu-weights q8_0` / `gguf`, issue 33).

Loads the model as a runner does (exo's `load_model` under `CpuKernels`, the BLAS the node preloads, MKL on one
thread as a runner serving ggml weights sets it), fills a cache with a prompt of each `--context` length, then times
`--steps` one-token decode steps, each setting taking its turn in every round (in the reverse order every other
round). `--decode-attention mlx` sends the step's attention to mlx-lm's (mlx's sdpa) where the engine's numpy
softmax would take it (kernels.MIN_DECODE_CONTEXT raised past the context). `--fusion step` (the engine's default)
runs each step as one ggml graph (`decode_graph.py`: its time is all `ggml_graph_compute` but the Python building
it), `on` through mlx-lm's model with the ggml products inside, `off` swaps each fused MLP for one the bench builds
from the same three layers, called apart (the product code carries no switch for it).
Timers wrap, for the step's duration: the `mx.eval` that runs mlx's pending work before each ggml product (norms,
rope, attention, SwiGLU, the hand-off to mlx's CPU stream; the numpy attention's own evaluation of its scores falls
to the last column), `ggml_graph_compute`, the rest of the ggml product call (ctypes, copies in and out, numpy and
`mx.array` conversions) and, as what is left, Python building mlx's graph plus the step's last evaluation. Not a test.

`uv run python -m bench.decode_breakdown [--model SPEC] [--weights q8_0,gguf] [--context 100,2000] [--steps 16]
[--rounds 3] [--fusion step,on,off] [--ggml-threads auto,1] [--decode-attention numpy,mlx]`
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, cast

from bench.machine import run_bench_worker

PARTS = ("wall", "mlx_eval", "graph_compute", "product_rest", "evals", "computes")


def _worker(
    model_spec: str | None,
    formats: list[str],
    contexts: list[int],
    steps: int,
    rounds: int,
    *,
    fusion: list[str],
    ggml_threads: list[str],
    decode_attention: list[str],
) -> None:
    import mlx.core as mx
    from mlx import nn
    from mlx_lm.models import activations
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from exo.models.paths import default_models_dir
    from exo.models.resolve import resolve_model
    from exo.shared.types.cpu_kernels import CpuWeightsSetting
    from exo.shared.types.worker.shards import ShardAssignment
    from exo.worker.engines.mlx.cpu import ggml_library, kernels, q8_layers, shared_input
    from exo.worker.engines.mlx.cpu.blas_check import set_blas_threads
    from exo.worker.engines.mlx.cpu.core_share import core_share
    from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
    from exo.worker.engines.mlx.cpu.engine import CpuKernels
    from exo.worker.engines.mlx.cpu.q8_layers import Q8Embedding, Q8Linear, SwiGluMlp
    from exo.worker.engines.mlx.model_loader import load_model

    class SeparateMlp(nn.Module):
        """A SwiGluMlp's three layers called apart, as SwiGluMlp calls them over prefill's rows (the code before
        the fusion)."""

        def __init__(self, mlp: SwiGluMlp) -> None:
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

        def __call__(self, x: mx.array) -> mx.array:
            return self.down_proj(activations.swiglu(self.gate_proj(x), self.up_proj(x)))

    totals: dict[str, float] = dict.fromkeys(PARTS, 0.0)

    def timed(function: Callable[..., Any], part: str, count: str | None = None) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                totals[part] += time.perf_counter() - started
                if count is not None:
                    totals[count] += 1

        return wrapper

    original_eval = mx.eval
    np = shared_input.np

    def activation_rows(x: mx.array) -> Any:
        started = time.perf_counter()
        original_eval(x)
        evaluated = time.perf_counter()
        rows = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        totals["mlx_eval"] += evaluated - started
        totals["evals"] += 1
        totals["product_rest"] += time.perf_counter() - evaluated
        return rows

    inner_as_mlx = shared_input.as_mlx
    for module in (shared_input, q8_layers):
        cast(Any, module).activation_rows = activation_rows
        cast(Any, module).as_mlx = timed(inner_as_mlx, "product_rest")
    original_run = ggml_library._Graph.run  # pyright: ignore[reportPrivateUsage]
    cast(Any, ggml_library._Graph).run = timed(original_run, "product_rest")  # pyright: ignore[reportPrivateUsage]

    path = resolve_model(model_spec, default_models_dir()).path
    models = {
        weights: load_model(
            path, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights=cast(CpuWeightsSetting, weights))
        ).model
        for weights in formats
    }
    libraries = {id(lib): lib for lib in _ggml_libraries(models.values())}
    for lib in libraries.values():
        lib.graph_compute = timed(lib.graph_compute, "graph_compute", "computes")
    set_blas_threads(1)
    layers = {weights: cast(list[Any], model["model"]["layers"]) for weights, model in models.items()}
    mlps = {weights: [layer["mlp"] for layer in found] for weights, found in layers.items()}
    separate = {
        weights: [SeparateMlp(m) if isinstance(m, SwiGluMlp) else m for m in found] for weights, found in mlps.items()
    }
    fusable = {weights: any(isinstance(m, SwiGluMlp) for m in found) for weights, found in mlps.items()}
    step_classes = {weights: type(model) for weights, model in models.items()}
    plain_classes = {
        weights: type(model).__bases__[-1] if decode_graph_of(model) is not None else type(model)
        for weights, model in models.items()
    }
    if "step" in fusion and (missing := [w for w, model in models.items() if decode_graph_of(model) is None]):
        raise SystemExit(f"--fusion step: the decode graph is not installed for {', '.join(missing)}")
    results: dict[str, list[dict[str, float]]] = {}
    default_decode_context = kernels.MIN_DECODE_CONTEXT
    for round_number in range(rounds):
        for weights, model in models.items():
            for context in contexts:
                cache = make_prompt_cache(model)  # one prefill a context; each setting's steps are trimmed off
                prompt = mx.array([[(index * 7) % 5000 + 100 for index in range(context)]])
                for start in range(0, context, 512):
                    original_eval(model(prompt[:, start : start + 512], cache=cache))
                settings = [(f, t, a) for f in fusion for t in ggml_threads for a in decode_attention]
                # Each round takes the settings in the other order: the first after the prefill is not always one.
                for fused, threads, attention in settings if round_number % 2 == 0 else settings[::-1]:
                    kernels.MIN_DECODE_CONTEXT = default_decode_context if attention == "numpy" else 1 << 40
                    for layer, mlp, apart in zip(layers[weights], mlps[weights], separate[weights], strict=True):
                        layer.mlp = apart if fused == "off" else mlp
                    # `step`: the decode step as one ggml graph (the engine's default); else mlx-lm's model.
                    model.__class__ = step_classes[weights] if fused == "step" else plain_classes[weights]
                    for _, module in model.named_modules():
                        if isinstance(module, (Q8Linear, Q8Embedding)):
                            module.q8.use_threads(None if threads == "auto" else int(threads))
                    tokens = mx.array([[42]])
                    original_eval(model(tokens, cache=cache))  # one warm-up step
                    for part in PARTS:
                        totals[part] = 0.0
                    started = time.perf_counter()
                    for _ in range(steps):
                        logits = model(tokens, cache=cache)
                        tokens = logits[:, -1].argmax(-1)[:, None]
                        original_eval(tokens)
                    totals["wall"] = time.perf_counter() - started
                    trim_prompt_cache(cache, steps + 1)
                    step = {
                        part: totals[part] * (1 if part in ("evals", "computes") else 1000) / steps for part in PARTS
                    }
                    mlp = fused if fusable[weights] else "none"
                    label = f"{weights}, {mlp}, ggml {threads}, {attention}, {context}"
                    results.setdefault(label, []).append(step)
                    share = core_share()
                    chosen = f" (now {share.threads()}, others {share.others:.2f} cores)" if threads == "auto" else ""
                    _progress(
                        f"round {round_number + 1} {label}{chosen}: "
                        + ", ".join(f"{part} {value:.1f}" for part, value in step.items())
                    )
    print(json.dumps(results))


def _ggml_libraries(models: Any) -> list[Any]:
    from exo.worker.engines.mlx.cpu.q8_layers import Q8Embedding, Q8Linear

    found: list[Any] = []
    for model in models:
        for _, module in model.named_modules():
            if isinstance(module, (Q8Linear, Q8Embedding)):
                found.append(module.q8.matrix.ggml)
    return found


def _progress(line: str) -> None:
    print(f"[bench.decode_breakdown {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="where a one-row quantized decode step's time goes")
    parser.add_argument("--model", default=None)
    parser.add_argument("--weights", default="q8_0,gguf")
    parser.add_argument("--context", default="100,2000")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--fusion",
        default="step,on",
        help="comma-separated: step (the whole decode step one ggml graph, the engine's default), on (mlx-lm's "
        "model, the MLP one ggml graph), off (mlx-lm's model, every product apart)",
    )
    parser.add_argument(
        "--ggml-threads",
        default="auto",
        help="comma-separated ggml pool sizes; auto: the engine's (the cores other processes leave, core_share.py)",
    )
    parser.add_argument(
        "--decode-attention",
        default="numpy",
        help="comma-separated: numpy (the engine's, over a long cache), mlx (mlx-lm's sdpa at every context)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    formats = arguments.weights.split(",")
    contexts = [int(value) for value in arguments.context.split(",")]
    if unknown := set(arguments.fusion.split(",")) - {"step", "on", "off"}:
        parser.error(f"--fusion takes step, on and/or off, not {', '.join(sorted(unknown))}")
    if unknown := set(arguments.decode_attention.split(",")) - {"numpy", "mlx"}:
        parser.error(f"--decode-attention takes numpy and/or mlx, not {', '.join(sorted(unknown))}")
    if arguments.worker:
        _worker(
            arguments.model,
            formats,
            contexts,
            arguments.steps,
            arguments.rounds,
            fusion=arguments.fusion.split(","),
            ggml_threads=arguments.ggml_threads.split(","),
            decode_attention=arguments.decode_attention.split(","),
        )
        return
    run = run_bench_worker("bench.decode_breakdown")
    results = cast(dict[str, list[dict[str, float]]], json.loads(run.stdout.strip().splitlines()[-1]))
    print(run.header)
    print(
        "| weights, MLP fusion, ggml threads, decode attention, context | step (wall) "
        "| `mx.eval` before products (mlx's ops) "
        "| `ggml_graph_compute` "
        "| rest of the product calls (ctypes, copies, conversions) | Python graph building + last eval "
        "| evals / computes a step |"
    )
    print("|---|---|---|---|---|---|---|")
    for key, rounds in results.items():
        median = {part: statistics.median(r[part] for r in rounds) for part in PARTS}
        walls = ", ".join(f"{r['wall']:.0f}" for r in rounds)
        median["product_rest"] -= median["graph_compute"]  # the graph runs' timers hold the computes
        rest = median["wall"] - median["mlx_eval"] - median["graph_compute"] - median["product_rest"]
        print(
            f"| {key} | {median['wall']:.1f} ms ({walls}) | {median['mlx_eval']:.1f} | {median['graph_compute']:.1f} "
            f"| {median['product_rest']:.1f} | {rest:.1f} | {median['evals']:.0f} / {median['computes']:.0f} |"
        )


if __name__ == "__main__":
    main()
