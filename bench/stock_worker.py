"""The stock mlx-lm baseline as its own process: `python -m bench.stock_worker SETUP_JSON`, then one request per line.

It loads the float32 copy the replacements worker wrote (`RawSetup.float32_copy`, the weights exo serves) with
`mlx_lm.load` and generates with a bare `mlx_lm.stream_generate` loop: no module of exo's engine is imported, so
none of its replacements (numpy kernels, matmul plan) can be in this process; `RawReady.exo_engine_imported` says
so, checked by the parent. The parent starts it with the BLAS preload exo's runner and mlx_lm.server get, so the
three compare the same library. Same protocol as `bench.raw_worker`, without the planned pass costs.
"""

import sys

from mlx_lm import load

from bench.raw_loop import answer, exo_engine_imported, measure_once, measure_pass_costs, prompt_tokens
from bench.raw_protocol import REQUESTS, PassCostRequest, RawReady, RawRequest, RawSetup

WARM_UP_MAX_TOKENS = 4


def main() -> None:
    setup = RawSetup.model_validate_json(sys.argv[1])
    model, tokenizer = load(str(setup.float32_copy))[:2]
    # Warm-up: first-call allocation and kernel setup are not throughput.
    measure_once(model, tokenizer, prompt_tokens(tokenizer, "warm-up"), WARM_UP_MAX_TOKENS)
    ready = RawReady(
        dtype="float32",
        matmul_gflops=None,  # exo's self-check lives in its engine; the replacements worker measures it
        loaded="mlx_lm.load of the float32 copy, no exo engine module imported",
        exo_engine_imported=exo_engine_imported(),
    )
    answer(ready.model_dump_json())
    for line in sys.stdin:
        match REQUESTS.validate_json(line):
            case RawRequest(tag=tag, max_tokens=max_tokens):
                reply = measure_once(model, tokenizer, prompt_tokens(tokenizer, tag), max_tokens).model_dump_json()
            case PassCostRequest(planned=True):
                raise SystemExit("the stock worker has no matmul plan: ask the replacements worker")
            case PassCostRequest() as request:
                reply = measure_pass_costs(model, prompt_tokens(tokenizer, "pass costs"), request).model_dump_json()
        answer(reply)


if __name__ == "__main__":
    main()
