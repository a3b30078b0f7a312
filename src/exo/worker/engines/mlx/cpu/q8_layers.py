"""Linear layers and embeddings whose weights stay ggml Q8_0 blocks on a CPU (`--cpu-weights q8_0`, issue 33).

A float32 decode step reads every weight once (about 2 GB for a 0.5B model), which bounds decode by the memory
bandwidth. Q8_0 holds each run of 32 weights as a float16 scale and 32 int8 values (34 bytes, 8.5 bits a weight),
and ggml's block kernels (`ggml_library.py`) multiply by them directly, quantizing the activations to Q8_0 on the
way: the kernels llama.cpp decodes with. The conversion goes one matrix at a time, `CONVERSION_ROWS` rows at a time
(an mlx-community quantized matrix is dequantized a slice at a time first), so loading never holds a whole matrix in
float32.

The layers run inside the mlx model the way `int8_layers.py`'s do: the activations are evaluated, read through
numpy, multiplied by one ggml graph over all their rows, and the product comes back as a new mlx array. Sibling
layers that multiply the same input (q/k/v, gate/up: `SIBLINGS`) share one graph (`shared_input.py`). Biases,
norms and everything that is not a matrix product stay in mlx, in float32. An embedding lookup dequantizes only the
rows it looks up; the tied output projection (`as_linear`) is a ggml product.
"""

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Final, cast

import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx import nn
from mlx.nn.layers.distributed import (
    AllToShardedLinear,
    QuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear,
    ShardedToAllLinear,
)
from mlx_lm.models import activations

from exo.worker.engines.mlx.cpu.core_share import core_share
from exo.worker.engines.mlx.cpu.dequant_gemm import dequantized_gemm, takes_dequantized
from exo.worker.engines.mlx.cpu.embedding_rows import EmbeddingRows, HeldRows
from exo.worker.engines.mlx.cpu.ggml_library import (
    CACHED_ROWS,
    Q8_0_BLOCK,
    Ggml,
    GgmlMatrix,
    GgmlSwiGluMlp,
    q8_0_to_float32,
)
from exo.worker.engines.mlx.cpu.int8_layers import CONVERSION_ROWS, float32_rows
from exo.worker.engines.mlx.cpu.matrix_replacement import replace_modules
from exo.worker.engines.mlx.cpu.shared_input import SharedInputProducts, activation_rows, as_mlx
from exo.worker.engines.mlx.discarded_logits import discarded_logits


def ggml_threads() -> int:
    """ggml's threads for a product now: the process's `core_share` count, every core this process may run on while
    other processes leave them free (llama-server's default), fewer while they hold some (`core_share.py`), or the
    count `EXO_GGML_THREADS` fixes. Measured on the 2-core AMD EPYC (docs/PERFORMANCE.md section 12): quiet, two
    threads as fast as one or faster at one row in five of six paired comparisons (69-73 against 74-78 ms a decode
    step) and 1.3-1.7x faster at 8 rows, where the products are compute-bound; with other processes busy, two
    threads 10-20x slower than one (each barrier waits for the descheduled thread)."""
    return core_share().threads()


BLAS_THREADS: Final = 1
"""The BLAS's threads in a runner serving Q8_0 (`set_blas_threads`): only attention's small matmuls are left to it,
and its idle threads, spinning after each call, took the cores ggml's products ran on (decode steps 1.3-1.9x
faster with MKL on one thread, docs/PERFORMANCE.md section 12)."""
GGML_POLL: Final = 0
"""How long ggml's idle pool threads spin before sleeping (0–100): 0, so they never take a core from mlx, MKL or
another process between two products."""


@cache
def ggml_library(library_dir: Path) -> Ggml:
    """The process's one handle on the ggml libraries in `library_dir` (loaded once)."""
    return Ggml(library_dir)


class Q8Weights:
    """One matrix held as Q8_0 in ggml, and the thread pool its products run on: `ggml_threads()` threads, read
    at each product (the count follows the cores other processes leave), unless `use_threads` fixes a count (the
    bench compares counts)."""

    def __init__(self, matrix: GgmlMatrix, threads: int | None = None) -> None:
        self.matrix = matrix
        self.use_threads(threads)

    @property
    def shape(self) -> tuple[int, int]:
        return self.matrix.shape

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    def use_threads(self, threads: int | None) -> None:
        """Run this matrix's products on `threads` threads from now on (None: `ggml_threads()` at each product)."""
        self.fixed_threads = threads

    @property
    def threads(self) -> int:
        """The thread count of the next product."""
        return ggml_threads() if self.fixed_threads is None else self.fixed_threads

    def pool_for(self, threads: int) -> int:
        """The process's ggml pool of `threads` threads (one per count, made on first use)."""
        return self.matrix.ggml.shared_threadpool(threads, GGML_POLL)

    def product(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """x (rows × in) · Wᵀ: ggml's block kernels, or over a prefill's rows the dequantized matrix times a float32
        GEMM (`dequant_gemm.takes_dequantized`)."""
        threads = self.threads
        if takes_dequantized([self.matrix], x.shape[0]):
            return dequantized_gemm().products([self.matrix], x, threads)[0]
        return self.matrix.product(x, threads, self.pool_for(threads))


def q8_from(module: nn.Module, ggml: Ggml) -> Q8Weights:
    """The module's weights as Q8_0 blocks, converted `CONVERSION_ROWS` rows at a time."""
    rows, _ = cast(tuple[int, int], tuple(module["weight"].shape))
    in_features = int(float32_rows(module, 0, 1).shape[1])  # a quantized matrix packs several weights a value
    matrix = GgmlMatrix(ggml, "Q8_0", rows, in_features)
    for start in range(0, rows, CONVERSION_ROWS):
        stop = min(start + CONVERSION_ROWS, rows)
        piece = float32_rows(module, start, stop)
        mx.eval(piece)
        matrix.fill(start, np.asarray(piece))
        del piece
    return Q8Weights(matrix)


def q8_product(x: mx.array, weights: Q8Weights) -> mx.array:
    """x · Wᵀ over x's leading dimensions: one ggml graph over all of x's rows."""
    return as_mlx(weights.product(activation_rows(x)), x)


class SharedInput:
    """A layer's place in a group of siblings that multiply the same input (`share_sibling_inputs`)."""

    def __init__(self, group: SharedInputProducts, member: int) -> None:
        self.group = group
        self.member = member


class Q8Linear(nn.Module):
    """A Linear layer with Q8_0 weights (its bias, if any, stays an mlx float32 array)."""

    def __init__(self, weights: Q8Weights, bias: mx.array | None) -> None:
        super().__init__()
        # A plain attribute, not an mlx parameter: mlx's tree utilities (set_dtype, parameters) leave it alone.
        self.q8 = weights
        if bias is not None:
            self.bias = bias.astype(mx.float32)
        self.shared: SharedInput | None = None
        """Set by `share_sibling_inputs`: the product comes from one graph with the sibling layers'."""
        self.output_head = False
        """Set by `mark_output_head`: the model's logits layer, skipped inside `logits_discarded`."""

    def __call__(self, x: mx.array) -> mx.array:
        if self.output_head and (skipped := discarded_logits(x, self.q8.shape[0])) is not None:
            return skipped
        product = self.product(x)
        return product + self["bias"] if "bias" in self else product

    def product(self, x: mx.array) -> mx.array:
        """x · Wᵀ without the bias (alone, or from the sibling layers' one graph)."""
        if self.shared is None:
            return q8_product(x, self.q8)
        threads = self.q8.threads
        return self.shared.group.product(x, self.shared.member, threads, self.q8.pool_for(threads))


class Q8ShardedToAllLinear(Q8Linear):
    """A tensor rank's share of a sharded-to-all layer (mlx's `ShardedToAllLinear`: o_proj, down_proj) as Q8_0
    blocks: this rank's input columns times its slice of the input, summed over the group, then the whole bias
    added once (as mlx's layer does: every rank holds the bias, none adds it to its partial product)."""

    def __init__(self, weights: Q8Weights, bias: mx.array | None, group: mx.distributed.Group) -> None:
        super().__init__(weights, bias)
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        summed = self.all_sum(self.product(x))
        return summed + self["bias"] if "bias" in self else summed

    def all_sum(self, partial: mx.array) -> mx.array:
        """The group's sum of every rank's partial product."""
        return mx.distributed.all_sum(partial, group=self.group)


class Q8Embedding(nn.Module):
    """An embedding table held as Q8_0: a lookup dequantizes the rows it reads; `as_linear` (tied output
    projection) is a ggml product."""

    def __init__(self, weights: Q8Weights) -> None:
        super().__init__()
        self.q8 = weights
        self.rows = HeldRows(weights.matrix)

    def __call__(self, ids: mx.array) -> mx.array:
        return looked_up(self.rows, q8_0_to_float32, ids)

    def as_linear(self, x: mx.array) -> mx.array:
        """The tied output head: skipped inside `logits_discarded`."""
        skipped = discarded_logits(x, self.q8.shape[0])
        return skipped if skipped is not None else q8_product(x, self.q8)


BlockDequantizer = Callable[[npt.NDArray[np.uint8]], npt.NDArray[np.float32]]
"""Rows of a type's blocks to their float32 values."""


def looked_up(rows: EmbeddingRows, dequantize: BlockDequantizer, ids: mx.array) -> mx.array:
    """The rows `ids` of an embedding table of blocks, `dequantize`d to float32 (ids' shape × hidden)."""
    mx.eval(ids)
    tokens = np.asarray(ids).astype(np.int64)
    values = dequantize(rows.take(tokens.reshape(-1)))
    return mx.array(values.astype(np.float32, copy=False).reshape(*tokens.shape, rows.shape[1]))


ALL_TO_SHARDED: Final = (AllToShardedLinear, QuantizedAllToShardedLinear)
"""mlx's layers holding a tensor rank's output rows: a row range of the matrix, held like any matrix."""
SHARDED_TO_ALL: Final = (ShardedToAllLinear, QuantizedShardedToAllLinear)
"""mlx's layers holding a tensor rank's input columns, whose partial products are summed over the group."""


def sharded_linear(module: nn.Module, weights: Q8Weights) -> Q8Linear:
    """The ggml layer serving mlx's sharded `module` (one of ALL_TO_SHARDED or SHARDED_TO_ALL) from `weights`, this
    rank's slice of its matrix: a sharded-to-all layer's partial product is summed over the module's group."""
    bias = module.get("bias")
    if isinstance(module, SHARDED_TO_ALL):
        return Q8ShardedToAllLinear(weights, bias, module.group)
    return Q8Linear(weights, bias)


def _replacement(module: nn.Module, ggml: Ggml) -> nn.Module | None:
    if isinstance(module, (*ALL_TO_SHARDED, *SHARDED_TO_ALL)) and _fits(module):
        # Still lazy: this rank's slice is read once (in its stored dtype), then converted a few rows at a time.
        mx.eval(module.parameters())
        return sharded_linear(module, q8_from(module, ggml))
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)) and _fits(module):
        return Q8Linear(q8_from(module, ggml), module.get("bias"))
    if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)) and _fits(module):
        return Q8Embedding(q8_from(module, ggml))
    return None


def quantize_model_q8(model: nn.Module, ggml: Ggml) -> int:
    """Replace every Linear, QuantizedLinear, Embedding and QuantizedEmbedding inside `model` whose rows split into
    Q8_0 blocks with its Q8_0 form, one matrix at a time (each original is released as soon as it is replaced);
    returns how many were replaced. A tensor rank's sharded layers (mlx's all-to-sharded and sharded-to-all linears,
    quantized or not) become Q8_0 blocks of this rank's slice; a sharded-to-all slice whose width is not a multiple
    of 32 stays mlx's float32 layer. Other parameters are left as they are (the caller sets their dtype)."""
    replaced = replace_modules(model, lambda module: _replacement(module, ggml))
    share_sibling_inputs(model)
    fuse_swiglu_mlps(model)
    mark_output_head(model)
    return replaced


def mark_output_head(model: nn.Module) -> bool:
    """Mark the model's untied logits layer (mlx-lm's `lm_head`), where it is a Q8Linear, as its output head;
    returns whether one was marked (a tied head is its embedding's `as_linear`, always the head)."""
    head = model.get("lm_head")
    if isinstance(head, Q8Linear):
        head.output_head = True
        return True
    return False


SIBLINGS: Final = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Child layers that the model's code calls one after another on the same input (mlx-lm's Attention and MLP of
qwen2, llama and the architectures that share their names)."""


def share_sibling_inputs(model: nn.Module) -> int:
    """Group each module's sibling Q8 layers (`SIBLINGS`) so that their products run as one ggml graph; returns how
    many groups were made. A module without the pattern keeps one graph a product."""
    groups = 0
    for _, module in model.named_modules():
        for names in SIBLINGS:
            layers = [module.get(name) for name in names] if isinstance(module, nn.Module) else []
            members = [layer for layer in layers if isinstance(layer, Q8Linear)]
            if len(members) != len(names) or len({layer.q8.shape[1] for layer in members}) != 1:
                continue
            group = SharedInputProducts([layer.q8.matrix for layer in members])
            for index, layer in enumerate(members):
                layer.shared = SharedInput(group, index)
            groups += 1
    return groups


def _fits(module: nn.Module) -> bool:
    """Whether a matrix module's rows split into whole Q8_0 blocks (every real model's do, and a tensor rank's
    column slice does where the width each rank takes is a multiple of 32; a matrix that does not stays float32)."""
    return int(float32_rows(module, 0, 1).shape[-1]) % Q8_0_BLOCK == 0


def q8_bytes(model: nn.Module) -> int:
    """Bytes of the Q8_0 blocks held by `model`'s Q8_0 layers."""
    return sum(module.q8.nbytes for _, module in model.named_modules() if isinstance(module, (Q8Linear, Q8Embedding)))


SWIGLU_MLPS: Final = frozenset({"mlx_lm.models.qwen2.MLP", "mlx_lm.models.llama.MLP", "mlx_lm.models.qwen3.MLP"})
"""mlx-lm's MLP classes whose call is exactly `down_proj(swiglu(gate_proj(x), up_proj(x)))` (read in their source:
the only ones `fuse_swiglu_mlps` replaces)."""


class SwiGluMlp(nn.Module):
    """An mlx-lm SwiGLU MLP whose three matrices are ggml layers: over at most `CACHED_ROWS` rows (decode steps) the
    whole MLP is one ggml graph (`GgmlSwiGluMlp`: one `mx.eval` of its input, one compute call), where the layers
    apart pay two of each a step (on a tensor rank, whose down_proj is a `Q8ShardedToAllLinear`, the graph's partial
    product is then summed over the group); over more rows (prefill) it calls its layers and SwiGLU as the original
    MLP does.
    Keeps the layers as its children under their names (`gate_proj`, `up_proj`, `down_proj`): thread settings, byte
    counts and module paths see them as before."""

    def __init__(self, gate_proj: Q8Linear, up_proj: Q8Linear, down_proj: Q8Linear) -> None:
        super().__init__()
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.down_proj = down_proj
        self.graph = GgmlSwiGluMlp(gate_proj.q8.matrix, up_proj.q8.matrix, down_proj.q8.matrix)

    def __call__(self, x: mx.array) -> mx.array:
        rows = 1
        for size in x.shape[:-1]:
            rows *= size
        if rows > CACHED_ROWS or takes_dequantized(self.graph.matrices, rows):
            # Looked up at each call: the numpy SwiGLU (`kernels.use_numpy_kernels`) re-points mlx-lm's modules after
            # this one is imported, and prefill must compute as mlx-lm's own MLP does.
            return self.down_proj(activations.swiglu(self.gate_proj(x), self.up_proj(x)))
        down = self.down_proj.q8
        threads = down.threads
        product = as_mlx(self.graph.product(activation_rows(x), threads, down.pool_for(threads)), x)
        # On a tensor rank the graph gives this rank's partial product: the group's sum is the MLP's output.
        return self.down_proj.all_sum(product) if isinstance(self.down_proj, Q8ShardedToAllLinear) else product


def fuse_swiglu_mlps(model: nn.Module) -> int:
    """Replace each SwiGLU MLP of `model` (`SWIGLU_MLPS`) whose three matrices are bias-free ggml layers of one
    library by a `SwiGluMlp`; returns how many were replaced."""

    def replacement(module: nn.Module) -> nn.Module | None:
        kind = f"{type(module).__module__}.{type(module).__qualname__}"
        if kind not in SWIGLU_MLPS:
            return None
        layers = [module.get(name) for name in ("gate_proj", "up_proj", "down_proj")]
        if not all(isinstance(layer, Q8Linear) and "bias" not in layer for layer in layers):
            return None
        gate, up, down = cast(list[Q8Linear], layers)
        try:
            return SwiGluMlp(gate, up, down)
        except ValueError:
            return None

    return replace_modules(model, replacement)
