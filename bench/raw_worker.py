"""The raw mlx-lm loop with exo's replacements as its own process: `python -m bench.raw_worker SETUP_JSON`, then one
request per line.

The model is loaded exactly as exo's runner loads it (`load_model`: float32 on a Linux CPU, the numpy kernels
re-pointed into mlx-lm) and generation is a bare `mlx_lm.stream_generate` loop: the report's "mlx-lm with exo's
replacements" row. Before answering requests the same float32 weights are saved to a directory, which the stock
baseline (`bench.stock_worker`, a process that never imports exo's engine) and mlx_lm.server load, so all serve the
very same numbers (on the float16 checkpoint they would skip BLAS on x86 and be many times slower: not a fair peer).
The parent starts it with the environment exo gives its runner (`blas_environment`), because the optimized BLAS
must be preloaded before mlx is imported.

Protocol (`bench.raw_protocol`): after setup one `RawReady` JSON line on stdout; then for each `RawRequest` line on
stdin one `StreamMeasurement` line, and for each `PassCostRequest` line one `PassCosts` line (timed on a second,
planned copy of the model when the request says so); stdin closing ends the process.
"""

import sys
from pathlib import Path

from bench.float32_weights import save_float32
from bench.raw_loop import answer, exo_engine_imported, measure_once, measure_pass_costs, prompt_tokens
from bench.raw_protocol import REQUESTS, PassCostRequest, RawReady, RawRequest, RawSetup
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.blas_check import measure_matmul_gflops
from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model

WARM_UP_MAX_TOKENS = 4


def _planned_copy(model_path: Path) -> LoadedModel:
    """The model loaded again with exo's matmul plan: the raw copy keeps mlx-lm's own products for its generations."""
    loaded = load_model(model_path, ShardAssignment())
    if (planner := MatmulPlanner.for_loaded(loaded)) is not None:
        planner.finish()  # as exo's runner does while idle, before the bench measures it
    return loaded


def main() -> None:
    setup = RawSetup.model_validate_json(sys.argv[1])
    loaded = load_model(setup.model_path, ShardAssignment())
    planned: LoadedModel | None = None
    save_float32(loaded.model, setup.model_path, setup.float32_copy)
    tokenizer = loaded.tokenizer
    # Warm-up: first-call allocation and kernel setup are not throughput.
    measure_once(loaded.model, tokenizer, prompt_tokens(tokenizer, "warm-up"), WARM_UP_MAX_TOKENS)
    ready = RawReady(
        dtype=loaded.dtype,
        matmul_gflops=measure_matmul_gflops(),
        loaded=f"exo's load_model ({loaded.dtype}, exo's replacements on as `--cpu-kernels auto` has them here)",
        exo_engine_imported=exo_engine_imported(),
    )
    answer(ready.model_dump_json())
    for line in sys.stdin:
        match REQUESTS.validate_json(line):
            case RawRequest(tag=tag, max_tokens=max_tokens):
                reply = measure_once(loaded.model, tokenizer, prompt_tokens(tokenizer, tag), max_tokens)
            case PassCostRequest() as request:
                if request.planned and planned is None:
                    planned = _planned_copy(setup.model_path)
                timed = planned if request.planned and planned is not None else loaded
                reply = measure_pass_costs(timed.model, prompt_tokens(tokenizer, "pass costs"), request)
        answer(reply.model_dump_json())


if __name__ == "__main__":
    main()
