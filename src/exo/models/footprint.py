"""Read a checkpoint's footprint from its safetensors headers (a few kilobytes each; no weights are read, no MLX).

A safetensors file starts with an 8-byte little-endian length and a JSON header naming each tensor's dtype, shape and
byte range. Weights are assigned to layers by the `layers.N.` part of their names; the rest is shared. A quantized
MLX checkpoint packs `32 / bits` weights into each uint32 and adds scales and biases, which dequantizing removes.
"""

import json
import math
import re
import struct
from pathlib import Path
from typing import Final, cast

from exo.models.gguf_source import gguf_tensor_bytes, kept_gguf
from exo.models.shard_files import WEIGHT_FILE_PATTERN
from exo.shared.types.footprint import ModelFootprint

_LAYER_NUMBER: Final = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_HEADER_LIMIT: Final = 100 * 1024 * 1024


class FootprintError(ValueError):
    """The checkpoint's headers or config cannot be read; the message says which file and why."""


def _read_header(path: Path) -> dict[str, dict[str, object]]:
    with path.open("rb") as file:
        prefix = file.read(8)
        if len(prefix) != 8:
            raise FootprintError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", prefix)
        if length > _HEADER_LIMIT:
            raise FootprintError(f"{path} has an implausible header length {length}")
        try:
            header: object = json.loads(file.read(length))
        except ValueError as error:
            raise FootprintError(f"{path} has an unreadable header: {error}") from error
    if not isinstance(header, dict):
        raise FootprintError(f"{path} has no tensor table")
    tables = cast(dict[str, object], header)
    return {name: cast(dict[str, object], entry) for name, entry in tables.items() if isinstance(entry, dict)}


def _quantization_bits(model_dir: Path) -> int | None:
    config: object = json.loads((model_dir / "config.json").read_text())
    quantization = config.get("quantization") if isinstance(config, dict) else None
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    return bits if isinstance(bits, int) and bits > 0 else None


def read_footprint(model_dir: Path) -> ModelFootprint:
    """The footprint of the checkpoint in `model_dir` (every `model*.safetensors` file)."""
    files = sorted(model_dir.glob(WEIGHT_FILE_PATTERN))
    if not files:
        raise FootprintError(f"{model_dir} has no safetensors weights")
    bits = _quantization_bits(model_dir)
    tensors: dict[str, dict[str, object]] = {}
    for path in files:
        tensors.update({name: entry for name, entry in _read_header(path).items() if name != "__metadata__"})
    layer_parameters: dict[int, int] = {}
    layer_bytes: dict[int, int] = {}
    shared_parameters = shared_bytes = 0
    for name, entry in tensors.items():
        parameters, stored = _sizes(name, entry, tensors, bits)
        match = _LAYER_NUMBER.search(name)
        if match is None:
            shared_parameters += parameters
            shared_bytes += stored
        else:
            layer = int(match.group(1))
            layer_parameters[layer] = layer_parameters.get(layer, 0) + parameters
            layer_bytes[layer] = layer_bytes.get(layer, 0) + stored
    if not layer_parameters:
        raise FootprintError(f"{model_dir} has no weights named after layers")
    layers = range(max(layer_parameters) + 1)
    config = _text_config(model_dir)
    gguf_layers, gguf_shared = _gguf_bytes(model_dir, len(layers))
    return ModelFootprint(
        layer_parameters=tuple(layer_parameters.get(layer, 0) for layer in layers),
        shared_parameters=shared_parameters,
        layer_file_bytes=tuple(layer_bytes.get(layer, 0) for layer in layers),
        shared_file_bytes=shared_bytes,
        attention_heads=_positive(config, "num_attention_heads"),
        # A config without a KV head count has as many as attention heads (no grouped-query attention).
        kv_heads=_positive(config, "num_key_value_heads") or _positive(config, "num_attention_heads"),
        mlp_width=_positive(config, "intermediate_size"),
        hidden_size=_positive(config, "hidden_size"),
        layer_gguf_bytes=gguf_layers,
        shared_gguf_bytes=gguf_shared,
    )


def _gguf_bytes(model_dir: Path, layer_count: int) -> tuple[tuple[int, ...] | None, int | None]:
    """The kept GGUF's tensor bytes per layer and outside any layer (None, None without a kept GGUF: no record, or
    the file gone or changed since the import, as a runner under `--cpu-weights auto` then holds Q8_0)."""
    tensor_bytes = gguf_tensor_bytes(model_dir)
    if tensor_bytes is None or kept_gguf(model_dir) is None:
        return None, None
    layers = [0] * layer_count
    shared = 0
    for name, size in tensor_bytes.items():
        match = _LAYER_NUMBER.search(name)
        if match is None:
            shared += size
        elif int(match.group(1)) < layer_count:
            layers[int(match.group(1))] += size
    return tuple(layers), shared


def _text_config(model_dir: Path) -> dict[str, object]:
    """The language model's config: config.json, or its `text_config` where it nests one."""
    config: object = json.loads((model_dir / "config.json").read_text())
    if not isinstance(config, dict):
        return {}
    typed = cast(dict[str, object], config)
    nested = typed.get("text_config")
    return cast(dict[str, object], nested) if isinstance(nested, dict) else typed


def _positive(config: dict[str, object], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and value > 0 else None


def _sizes(
    name: str, entry: dict[str, object], tensors: dict[str, dict[str, object]], bits: int | None
) -> tuple[int, int]:
    """(parameters once dequantized, bytes as stored) of one tensor."""
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(shape, list) or not isinstance(offsets, list) or len(cast(list[object], offsets)) != 2:
        raise FootprintError(f"tensor {name} has no shape or byte range")
    begin, end = cast(list[int], offsets)
    stored = end - begin
    count = math.prod(cast(list[int], shape))
    base = name.removesuffix(".weight")
    if bits is not None and name.endswith((".scales", ".biases")):
        return 0, stored
    if bits is not None and entry.get("dtype") == "U32" and f"{base}.scales" in tensors:
        return count * (32 // bits), stored
    return count, stored


def weight_dtypes(model_dir: Path) -> list[str]:
    """The stored dtype of every tensor in the checkpoint in `model_dir` (safetensors names: BF16, F32...)."""
    dtypes: list[str] = []
    for path in sorted(model_dir.glob(WEIGHT_FILE_PATTERN)):
        for name, entry in _read_header(path).items():
            dtype = entry.get("dtype")
            if name != "__metadata__" and isinstance(dtype, str):
                dtypes.append(dtype)
    return dtypes
