"""A model loaded for serving, as the generator, the CPU engine and the pipeline ranks use it.

Its own module, below `cpu/` and `distributed/`: they read a `LoadedModel`, and `model_loader.py`, which builds
one, uses them.
"""

from dataclasses import dataclass

import mlx.core as mx
from mlx import nn
from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.shared.types.worker.shards import PipelineStrategy, ShardAssignment


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: TokenizerWrapper
    context_length: int
    dtype: str
    shard: ShardAssignment
    # The width of the logits: how many tokens sampling chooses from (top_k must stay below it).
    vocabulary_size: int
    # The ring this rank's pipeline runs over, and how the model was split (None for a whole model).
    group: mx.distributed.Group | None = None
    strategy: PipelineStrategy | None = None
