"""What a KV snapshot on disk is valid for: the exact weights, the format the runner holds them in, and the layers
this runner holds of them."""

import hashlib
from pathlib import Path

from exo.models.gguf_source import read_gguf_source
from exo.shared.types.worker.shards import ShardAssignment


def model_identity(model_path: Path, shard: ShardAssignment, weights_format: str) -> str:
    """A digest of the model's config, its weight files (names and sizes), the format the runner serves the weights
    in (`LoadedModel.dtype`: float32, int8, q8_0, gguf or native; under gguf the kept GGUF's path, size and time
    too) and the shard's layers.

    The format is part of it because the KV values depend on it: int8 or Q8_0 weights give slightly different keys
    and values than float32 ones, so a snapshot written under one is never served under the other.

    Reading every weight byte would take as long as loading the model again; a converted or re-downloaded model
    changes its files' sizes or its config, and a different split changes the layer range.
    """
    digest = hashlib.sha256()
    config = model_path / "config.json"
    digest.update(config.read_bytes() if config.exists() else b"")
    for weights in sorted(model_path.glob("*.safetensors")):
        digest.update(f"{weights.name}:{weights.stat().st_size};".encode())
    digest.update(f"weights {weights_format};".encode())
    if weights_format == "gguf":
        # Served from the kept GGUF's blocks, not the imported files: which file, and which version of it.
        source = read_gguf_source(model_path)
        if source is not None:
            digest.update(f"gguf {source.path}:{source.size}:{source.mtime_ns};".encode())
    split = shard.peers.layer_counts if shard.peers is not None else ()
    digest.update(f"rank {shard.rank}/{shard.world_size} layers {shard.start_layer}-{shard.end_layer} {split}".encode())
    # A tensor rank's KV holds only its share of the heads: never served to a whole model or a pipeline stage.
    if shard.is_tensor:
        digest.update(b" tensor")
    return digest.hexdigest()
