"""`python -m bench.random_model SOURCE_DIR TARGET_DIR [--dtype bfloat16]`: random weights in a model's shape.

For throughput runs on a machine the real weights cannot reach (a lent GPU machine with no network): the target has
the source's architecture, layer count, widths and vocabulary, and its real tokenizer and chat template, with
normally distributed weights (seed 0). Forward-pass cost depends on the shapes, not the values, so decode, prefill
and batching figures carry over; what the model writes (tool calls, draft acceptance, replies) does not.
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes  # pyright: ignore[reportPrivateUsage]

_DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
_COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def write_random_model(source: Path, target: Path, dtype: str) -> int:
    """Write the random model to `target`; returns its parameter count."""
    config = json.loads((source / "config.json").read_text())
    config["torch_dtype"] = dtype
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    mx.random.seed(0)
    shapes: dict[str, mx.array] = tree_flatten(model.parameters(), destination={})  # pyright: ignore[reportAssignmentType]
    parameters = {name: (mx.random.normal(value.shape) * 0.02).astype(_DTYPES[dtype]) for name, value in shapes.items()}
    target.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(target / "model.safetensors"), parameters, metadata={"format": "mlx"})
    (target / "config.json").write_text(json.dumps(config, indent=2))
    for name in _COPIED:
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    return sum(value.size for value in parameters.values())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.random_model", description=__doc__)
    parser.add_argument("source", type=Path, help="a model directory (config.json and tokenizer files are read)")
    parser.add_argument("target", type=Path)
    parser.add_argument("--dtype", choices=tuple(_DTYPES), default="bfloat16")
    arguments = parser.parse_args()
    count = write_random_model(arguments.source, arguments.target, arguments.dtype)
    print(f"random weights in {arguments.target}: {count:,} parameters, {arguments.dtype}")


if __name__ == "__main__":
    main()
