"""A checkpoint's architecture, parameter count, bytes and storage format, from its config and safetensors headers
(no weights read, no MLX): what model listings such as Ollama's show."""

import json
from collections import Counter
from pathlib import Path

from exo.models.footprint import FootprintError, read_footprint, weight_dtypes
from exo.shared.types.worker.runner_response import CheckpointFacts

_STORED: dict[str, str] = {"BF16": "BF16", "F16": "F16", "F32": "F32"}


def checkpoint_facts(model_dir: Path) -> CheckpointFacts:
    """The facts of the checkpoint in `model_dir`; raises FootprintError when its files cannot be read."""
    try:
        config: object = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise FootprintError(f"{model_dir / 'config.json'} cannot be read: {error}") from error
    if not isinstance(config, dict):
        raise FootprintError(f"{model_dir / 'config.json'} is not an object")
    family = config.get("model_type")
    quantization = config.get("quantization")
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    footprint = read_footprint(model_dir)
    if isinstance(bits, int):
        stored = f"Q{bits}"
    else:
        dtypes = Counter(weight_dtypes(model_dir))
        stored = _STORED.get(dtypes.most_common(1)[0][0], "unknown") if dtypes else "unknown"
    return CheckpointFacts(
        family=family if isinstance(family, str) and family else "unknown",
        parameter_count=footprint.shared_parameters + sum(footprint.layer_parameters),
        file_bytes=footprint.shared_file_bytes + sum(footprint.layer_file_bytes),
        quantization=stored,
        gguf_bytes=(
            footprint.shared_gguf_bytes + sum(footprint.layer_gguf_bytes)
            if footprint.layer_gguf_bytes is not None and footprint.shared_gguf_bytes is not None
            else None
        ),
    )
