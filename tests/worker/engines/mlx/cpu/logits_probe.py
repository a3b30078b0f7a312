"""Run in a fresh process (`python -m tests.worker.engines.mlx.cpu.logits_probe MODE`): a fixture model's logits
from stock mlx-lm, computed before anything of exo is imported, beside exo's under one `--cpu-kernels` setting.

Prints one JSON object: the largest absolute difference, whether the argmaxes agree, the dtype exo served in,
whether mlx-lm's model module still holds mlx-lm's own attention and SwiGLU, and exo's report of its replacements.
MODE `changed-swiglu` first gives mlx-lm a `swiglu` with another signature (a new parameter), as a newer mlx-lm
might.
"""

import json
import sys

import mlx.core as mx
import mlx_lm
from mlx_lm.models import activations, base
from mlx_lm.models.cache import make_prompt_cache

FIXTURE = "tests/fixtures/models/tiny-qwen-tools"
TOKENS = [[(index * 37) % 200 + 5 for index in range(96)]]


STOCK_ATTENTION = base.scaled_dot_product_attention
STOCK_SWIGLU = activations.swiglu


def _changed_swiglu(gate: mx.array, x: mx.array, *, alpha: float = 1.0) -> mx.array:
    """What a newer mlx-lm might ship: the same call with a new parameter (which exo's replacement would drop)."""
    return STOCK_SWIGLU(gate, x) * alpha


def main(mode: str) -> None:
    if mode == "changed-swiglu":
        activations.swiglu = _changed_swiglu
    stock_model = mlx_lm.load(FIXTURE)[0]
    stock = stock_model(mx.array(TOKENS), cache=make_prompt_cache(stock_model))
    mx.eval(stock)

    from exo.shared.types.worker.shards import ShardAssignment
    from exo.worker.engines.mlx.cpu import kernels
    from exo.worker.engines.mlx.cpu.engine import CpuKernels
    from exo.worker.engines.mlx.model_loader import load_model

    # Route even this short prompt through the numpy kernels, where they are on.
    kernels.MIN_SCORES = kernels.MIN_GATE_VALUES = 1
    cpu_kernels = CpuKernels("off" if mode == "off" else "auto")
    loaded = load_model(__import__("pathlib").Path(FIXTURE), ShardAssignment(), cpu_kernels=cpu_kernels)
    served = loaded.model(mx.array(TOKENS), cache=make_prompt_cache(loaded.model))
    module = sys.modules[type(loaded.model).__module__]
    print(
        json.dumps(
            {
                "max_difference": mx.abs(served - stock).max().item(),
                "same_argmax": bool((mx.argmax(served, axis=-1) == mx.argmax(stock, axis=-1)).all().item()),
                "dtype": loaded.dtype,
                "stock_attention": vars(module)["scaled_dot_product_attention"] is STOCK_ATTENTION,
                "stock_swiglu": vars(module)["swiglu"] in {STOCK_SWIGLU, _changed_swiglu},
                "report": cpu_kernels.report().model_dump(),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
