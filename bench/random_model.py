"""`python -m bench.random_model SOURCE_DIR TARGET_DIR [--dtype bfloat16] [--layers N --hidden-size H ...]`: random
weights in a model's shape.

For throughput runs on a machine the real weights cannot reach (a lent GPU machine with no network): the target has
the source's architecture, layer count, widths and vocabulary, and its real tokenizer and chat template, with
normally distributed weights (seed 0). Forward-pass cost depends on the shapes, not the values, so decode, prefill
and batching figures carry over; what the model writes (tool calls, draft acceptance, replies) does not.

The shape options make a reduced model instead (fewer layers, narrower), still with the real tokenizer and
vocabulary: a CPU stand-in for an accelerator, whose forward pass takes a few milliseconds as a mid-size model's
does on a GPU, so that what the serving loop costs around it shows (docs/PERFORMANCE.md, issue 36's stand-in).
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes  # pyright: ignore[reportPrivateUsage]
from pydantic import BaseModel

_DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
_COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


class ReducedShape(BaseModel):
    """Overrides of the source's shape (None: keep the source's)."""

    layers: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    attention_heads: int | None = None
    key_value_heads: int | None = None

    def apply(self, config: dict[str, object]) -> None:
        overrides = {
            "num_hidden_layers": self.layers,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.attention_heads,
            "num_key_value_heads": self.key_value_heads,
        }
        config.update({key: value for key, value in overrides.items() if value is not None})
        hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
        if self.hidden_size is not None or self.attention_heads is not None:
            assert isinstance(hidden, int)
            assert isinstance(heads, int)
            config["head_dim"] = hidden // heads


def write_random_model(source: Path, target: Path, dtype: str, shape: ReducedShape | None = None) -> int:
    """Write the random model to `target`; returns its parameter count."""
    config = json.loads((source / "config.json").read_text())
    config["torch_dtype"] = dtype
    if shape is not None:
        shape.apply(config)
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
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden-size", type=int)
    parser.add_argument("--intermediate-size", type=int)
    parser.add_argument("--attention-heads", type=int)
    parser.add_argument("--key-value-heads", type=int)
    arguments = parser.parse_args()
    shape = ReducedShape(
        layers=arguments.layers,
        hidden_size=arguments.hidden_size,
        intermediate_size=arguments.intermediate_size,
        attention_heads=arguments.attention_heads,
        key_value_heads=arguments.key_value_heads,
    )
    count = write_random_model(arguments.source, arguments.target, arguments.dtype, shape)
    print(f"random weights in {arguments.target}: {count:,} parameters, {arguments.dtype}")


if __name__ == "__main__":
    main()
