"""Q6_K packed into exo's own layout at load (`rows_kernel.cpp`'s `BlockQ6Kx16`, issue 33): the packing loses nothing
(packed and unpacked, the blocks come back byte for byte), the packed products are exactly the stored-layout
kernel's where that one takes the rows and within ggml's rounding everywhere (one row to prefill pieces), every
graph that multiplies a packed matrix takes its own product, and a Q6_K model served with its matrices packed
decodes as with ggml's products.

They need the kernel built with `uv run exo ggml build` on an x86-64 CPU with AVX-512 VNNI; without it they skip for
a reason of the machine.
"""

import ctypes
from pathlib import Path

import numpy as np
import pytest
from mlx import nn

from bench.ggml_kernels import RowsProduct
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.engine import DECODE_GRAPH_VARIABLE, LAYER_GRAPH_VARIABLE, CpuKernels
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES, Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.gguf_layers import packed_matrices
from exo.worker.engines.mlx.cpu.rows_kernel import ROWS_KERNEL_VARIABLE, RowsKernel, rows_kernel
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.machine_skips import skip_for_machine
from tests.worker.engines.mlx.cpu.gguf_export import export_wide
from tests.worker.engines.mlx.cpu.test_decode_graph import PROMPT
from tests.worker.engines.mlx.cpu.test_rows_kernel import (
    _fed,  # pyright: ignore[reportPrivateUsage]
    _rms,  # pyright: ignore[reportPrivateUsage]
    _rows_taken,  # pyright: ignore[reportPrivateUsage]
    activations,
)
from tests.worker.engines.mlx.cpu.weight_formats import assert_within_product_rounding

THREADS = 2
Q6_K = GGML_TYPES["Q6_K"]


@pytest.fixture
def packing(ggml: Ggml) -> RowsKernel:
    found = rows_kernel(ggml.library_dir)
    if found is None or not found.packs("Q6_K", 16, 256):
        skip_for_machine("exo packs Q6_K with AVX-512 VNNI only (`uv run exo ggml build` on such an x86-64 CPU)")
    return found


def _stored(ggml: Ggml, out_features: int, in_features: int, seed: int) -> tuple[GgmlMatrix, np.ndarray]:
    """A Q6_K matrix of seeded Gaussian weights quantized by ggml, and the weights."""
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((out_features, in_features)) * 0.05).astype(np.float32)
    weights[:, 40] *= 30.0  # an outlier column: its group's scale is far from the others'
    weights[: out_features // 3, 256:512] = 0.0  # whole super-blocks of zeros (d = 0)
    matrix = GgmlMatrix(ggml, "Q6_K", out_features, in_features)
    matrix.fill(0, weights)
    return matrix, weights


def test_packing_loses_nothing(ggml: Ggml, packing: RowsKernel) -> None:
    stored, _ = _stored(ggml, 48, 768, seed=3)
    try:
        packed = GgmlMatrix.packed_from_blocks(ggml, "Q6_K", 48, 768, stored.blocks, layout=packing)
        assert packed is not None
        held = np.ctypeslib.as_array((ctypes.c_uint8 * packed.nbytes).from_address(int(ggml.get_data(packed.tensor))))
        assert not np.array_equal(held, stored.blocks.reshape(-1))  # rearranged, not copied
        restored = np.empty_like(stored.blocks)
        packing.unpack("Q6_K", int(ggml.get_data(packed.tensor)), restored, 768)
        assert np.array_equal(restored, stored.blocks)
        packed.close()
    finally:
        stored.close()


def test_only_whole_groups_of_sixteen_q6_k_outputs_are_packed(ggml: Ggml, packing: RowsKernel) -> None:
    stored, _ = _stored(ggml, 100, 256, seed=5)  # 100 outputs: the last group of 16 short
    try:
        assert GgmlMatrix.packed_from_blocks(ggml, "Q6_K", 100, 256, stored.blocks, layout=packing) is None
    finally:
        stored.close()
    assert packing.packs("Q6_K", 96, 512)
    assert not packing.packs("Q4_K", 96, 512)
    assert not packing.packs("Q8_0", 96, 512)
    stored, _ = _stored(ggml, 32, 256, seed=5)
    packed = GgmlMatrix.packed_from_blocks(ggml, "Q6_K", 32, 256, stored.blocks, layout=packing)
    assert packed is not None
    with pytest.raises(ValueError, match="packed Q6_K matrix cannot be dequantized"):
        packed.dequantize(0, 1, np.empty(256, dtype=np.float32))
    with pytest.raises(ValueError, match="packed"):
        _ = packed.blocks
    packed.close()
    stored.close()


@pytest.mark.parametrize("out_features", [96, 912])  # 6 and 57 groups of 16 outputs: thread shares of both parities
@pytest.mark.parametrize("in_features", [256, 768])
def test_packed_products_are_the_stored_kernels_and_within_ggmls_rounding(
    ggml: Ggml, packing: RowsKernel, out_features: int, in_features: int
) -> None:
    """Every row count a register of rows takes (1-16), a short second chunk (17), a panel (64), a second short
    panel (101) and a prefill piece (300): exactly the stored layout's kernel product where it takes the rows (the
    same quantized rows, scales and sums in the same order), and as near the blocks' own product as ggml's (exo
    quantizes the rows per 32 values, ggml per 256)."""
    stored, weights = _stored(ggml, out_features, in_features, seed=11)
    packed = GgmlMatrix.packed_from_blocks(ggml, "Q6_K", out_features, in_features, stored.blocks, layout=packing)
    assert packed is not None
    dense = np.empty((out_features, in_features), dtype=np.float32)
    stored.dequantize(0, out_features, dense)
    pool = ggml.shared_threadpool(THREADS)
    rng = np.random.default_rng(13)
    try:
        for rows in [*range(1, 17), 17, 64, 101, 300]:
            x = activations(rng, rows, in_features)
            ours = packed.product(x, THREADS, pool)  # `GgmlMatrix.product_node`: the packed product
            theirs = stored.product(x, THREADS, pool)  # ggml's
            if packing.applies(Q6_K, in_features, rows):
                assert np.array_equal(ours, _stored_kernel_product(ggml, packing, weights, x)), rows
            held = x.astype(np.float64) @ dense.T.astype(np.float64)
            scale = float(np.abs(held).max())
            # exo rounds rows per 32 values, ggml per 256: with the outlier channel in the same 256 as the outlier
            # weights (another 32), ggml's largest error was seen at 6.3% of the largest value, exo's at 1.2%.
            assert float(np.abs(ours - held).max()) < 0.03 * scale, rows
            assert _rms(ours - held) < _rms(theirs - held), rows
    finally:
        packed.close()
        stored.close()


def _stored_kernel_product(ggml: Ggml, kernel: RowsKernel, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x times the weights' Q6_K blocks as stored (ggml quantizes the same weights the same way) through the
    kernel's stored-layout product."""
    product = RowsProduct.create(ggml, kernel, weights, type_name="Q6_K", rows=x.shape[0], threads=THREADS)
    try:
        return product.run(x)
    finally:
        product.close()


def _loaded(exported: Path) -> nn.Module:
    return exo_load_model(exported, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights="gguf")).model


@pytest.mark.usefixtures("packing")
@pytest.mark.parametrize("sequences", [1, 3, 9])
def test_a_q6_k_model_packed_decodes_as_through_ggmls_products(
    ggml: Ggml, sequences: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A model of Q6_K matrices (its embedding, looked up, stays as stored): its layers' matrices are packed at load
    and its prefill pass and decode steps (a row a sequence) go through the packed products, with ggml's logits
    within the products' rounding over five fed steps. `EXO_ROWS_KERNEL=off` packs nothing."""
    exported = export_wide(ggml, tmp_path, "Q6_K")
    ours_model = _loaded(exported)
    assert packed_matrices(ours_model) == 2 * 7  # two layers' q, k, v, o, gate, up and down
    with monkeypatch.context() as switched:
        switched.setenv(ROWS_KERNEL_VARIABLE, "off")
        theirs_model = _loaded(exported)
    assert packed_matrices(theirs_model) == 0
    taken = _rows_taken(monkeypatch, "packed_product")
    prompts = [PROMPT[offset : offset + 12 + 3 * offset] for offset in range(sequences)]
    ours = _fed(ours_model, prompts)
    assert sequences * max(len(prompt) for prompt in prompts) in taken  # the prefill pass
    assert sequences in taken  # the decode steps
    theirs = _fed(theirs_model, prompts)
    for a, b in zip(ours, theirs, strict=True):
        assert_within_product_rounding(a, b)


@pytest.mark.usefixtures("packing")
def test_packed_matrices_are_multiplied_by_their_own_product_in_mlx_lms_layers(
    ggml: Ggml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With the decode graph off, steps run mlx-lm's layers over ggml graphs of their own (shared inputs, the fused
    MLP): those take a packed matrix's own product too, with the same logits as the decode graph's."""
    exported = export_wide(ggml, tmp_path, "Q6_K")
    graph_model = _loaded(exported)
    with monkeypatch.context() as switched:
        switched.setenv(DECODE_GRAPH_VARIABLE, "off")
        layers_model = _loaded(exported)
    assert packed_matrices(layers_model) == 2 * 7
    taken = _rows_taken(monkeypatch, "packed_product")
    prompts = [PROMPT[offset : offset + 14] for offset in range(3)]
    ours = _fed(layers_model, prompts)
    assert 3 in taken
    for a, b in zip(ours, _fed(graph_model, prompts), strict=True):
        assert_within_product_rounding(a, b)
    with monkeypatch.context() as switched:  # no ggml graph at all: nothing packed, the kernel said off
        switched.setenv(DECODE_GRAPH_VARIABLE, "off")
        switched.setenv(LAYER_GRAPH_VARIABLE, "off")
        assert packed_matrices(_loaded(exported)) == 0
