"""Load a model with mlx-lm for one shard: the CPU engine's replacements applied, a pipeline stage cut to its
layers, a tensor rank cut to its share of every layer's matrices."""

import json
import logging
import os
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx import nn
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model as mlx_lm_load_model
from mlx_lm.utils import load_tokenizer

from exo.models.errors import ModelLoadError
from exo.models.shard_files import missing_weight_files
from exo.shared.types.worker.shards import PipelineStrategy, ShardAssignment
from exo.worker.engines.mlx.compiled_blocks import install_compiled_blocks
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.distributed.layer_split import split_layers
from exo.worker.engines.mlx.distributed.tensor_split import shard_matrices
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.tokenizer_memory import drop_construction_copies, share_detokenizer_tokens

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT_LENGTH = 4096


def _context_length(config: dict[str, Any]) -> int:
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    text_config = config.get("text_config")
    if isinstance(text_config, dict):
        return _context_length(cast(dict[str, Any], text_config))
    return DEFAULT_CONTEXT_LENGTH


def _vocabulary_size(config: dict[str, Any], tokenizer: TokenizerWrapper) -> int:
    """The logits' width from the config (it can exceed the tokenizer's vocabulary: padded embeddings)."""
    for candidate in (config, config.get("text_config")):
        if isinstance(candidate, dict):
            value = cast(dict[str, Any], candidate).get("vocab_size")
            if isinstance(value, int) and value > 0:
                return value
    return len(tokenizer.vocab)


def load_model(
    path: Path,
    shard: ShardAssignment,
    *,
    trust_remote_code: bool = False,
    group: mx.distributed.Group | None = None,
    cpu_kernels: CpuKernels | None = None,
    tokenizer: TokenizerWrapper | None = None,
) -> LoadedModel:
    """Load `path` (an mlx-lm directory) for `shard`; raises ModelLoadError naming the path and the cause.

    `tokenizer`: the one `load_model_tokenizer` read already (the runner describes the model with it before the
    weights load); read here when not given.

    `cpu_kernels` applies the CPU engine's replacements it has on (default: those `--cpu-kernels auto` has here).

    A pipeline shard (world size > 1) needs the ring `group` it runs over; only its layers' weights are read. A
    tensor shard reads every layer's files but keeps only its share of the sharded matrices.
    `trust_remote_code` lets the model directory's own Python run: a custom architecture (`model_file` in
    config.json) and a custom tokenizer class. Off, such a model fails to load with a message saying so.
    """
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist")
    kernels = cpu_kernels or CpuKernels()
    if shard.world_size != 1:
        if group is None:
            raise ModelLoadError("a pipeline shard needs the ring group it runs over")
        return _load_pipeline_stage(path, shard, group, trust_remote_code, kernels, tokenizer=tokenizer)
    try:
        model, config = mlx_lm_load_model(path, lazy=kernels.loads_lazily, trust_remote_code=trust_remote_code)
    except Exception as error:
        raise ModelLoadError(f"cannot load model from {path}: {type(error).__name__}: {error}") from error
    if tokenizer is None:
        tokenizer = load_model_tokenizer(path, trust_remote_code=trust_remote_code)
    return _loaded(model, tokenizer, config, shard, kernels, path=path)


def load_model_tokenizer(path: Path, *, trust_remote_code: bool = False) -> TokenizerWrapper:
    """`path`'s tokenizer as mlx-lm wraps it (its end-of-sequence ids from config.json, as mlx-lm's `load` does),
    without the Python copies transformers keeps of what it built the Rust backend from, its streaming detokenizer
    reading token strings from the backend (`tokenizer_memory.py`); raises ModelLoadError naming the path and the
    cause."""
    try:
        eos_token_ids = _read_config(path).get("eos_token_id")
        tokenizer = load_tokenizer(path, {"trust_remote_code": trust_remote_code}, eos_token_ids=eos_token_ids)
    except Exception as error:
        raise ModelLoadError(f"cannot load the tokenizer of {path}: {type(error).__name__}: {error}") from error
    drop_construction_copies(tokenizer)
    share_detokenizer_tokens(tokenizer)
    return tokenizer


def model_context_length(path: Path) -> int:
    """The context length `path`'s config.json gives (DEFAULT_CONTEXT_LENGTH where it gives none)."""
    return _context_length(_read_config(path))


def model_vocabulary_size(path: Path, tokenizer: TokenizerWrapper) -> int:
    return _vocabulary_size(_read_config(path), tokenizer)


def _load_pipeline_stage(
    path: Path,
    shard: ShardAssignment,
    group: mx.distributed.Group,
    trust_remote_code: bool,
    kernels: CpuKernels,
    *,
    tokenizer: TokenizerWrapper | None,
) -> LoadedModel:
    """Build the model lazily, cut it down to this rank's layers, then read only the weights those need."""
    missing = missing_weight_files(path, shard.start_layer, shard.end_layer)
    if missing:
        raise ModelLoadError(
            f"cannot load layers {shard.start_layer}..{shard.end_layer} of {path}: missing {', '.join(missing)}"
        )
    try:
        model, config = mlx_lm_load_model(path, lazy=True, strict=False, trust_remote_code=trust_remote_code)
        if tokenizer is None:
            tokenizer = load_tokenizer(
                path, {"trust_remote_code": trust_remote_code}, eos_token_ids=config.get("eos_token_id", None)
            )
        strategy = shard_matrices(model, group) if shard.is_tensor else split_layers(model, group, shard)
    except Exception as error:
        raise ModelLoadError(f"cannot load model from {path}: {type(error).__name__}: {error}") from error
    return _loaded(model, tokenizer, config, shard, kernels, path=path, group=group, strategy=strategy)


def _loaded(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    config: dict[str, Any],
    shard: ShardAssignment,
    kernels: CpuKernels,
    *,
    path: Path,
    group: mx.distributed.Group | None = None,
    strategy: PipelineStrategy | None = None,
) -> LoadedModel:
    """Finish loading: the CPU engine's replacements, weights materialised, and what the runner reports."""
    # A layer-range stage numbers its kept layers from 0; mlx-lm's own pipeline keeps their numbers.
    first_layer = shard.start_layer if strategy == "layer-range" else 0
    dtype = kernels.prepare_model(model, path, first_layer, split=shard.world_size > 1)
    mx.eval(model.parameters())
    logger.info("%s", install_compiled_blocks(model, os.environ))
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        context_length=_context_length(config),
        dtype=dtype,
        shard=shard,
        vocabulary_size=_vocabulary_size(config, tokenizer),
        group=group,
        strategy=strategy,
    )


def _read_config(path: Path) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((path / "config.json").read_text()))
