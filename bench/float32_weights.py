"""Float32 copies of a model's weights, the dtype every system of a CPU comparison must serve.

On x86 mlx multiplies float16 and bfloat16 matrices with its own kernels, not the optimized BLAS exo's runner
preloads: a prefill there runs many times slower, which would measure the dtype rather than the server.
"""

import json
import shutil
from pathlib import Path
from typing import cast

import mlx.core as mx
from mlx import nn
from mlx_lm.utils import load_model, save_model

_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")


def save_float32(model: nn.Module, source: Path, destination: Path) -> None:
    """Write `model`'s (float32) weights next to a copy of the source's config and tokenizer files."""
    destination.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(item, destination / item.name)
    save_model(destination, model)
    config_path = destination / "config.json"
    config = cast(dict[str, object], json.loads(config_path.read_text()))
    # The weights are now plain float32: a quantization entry would make mlx-lm rebuild quantized layers.
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    config["torch_dtype"] = "float32"
    config_path.write_text(json.dumps(config, indent=2))


def float32_copy(source: Path, destination: Path) -> Path:
    """The model at `source` loaded with stock mlx-lm, cast to float32 and saved to `destination` (returned)."""
    model, _ = load_model(source)
    model.set_dtype(mx.float32)
    save_float32(model, source, destination)
    return destination
