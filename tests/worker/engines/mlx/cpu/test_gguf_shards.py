"""A tensor rank's slice of a GGUF matrix (`gguf_shards.shard_blocks`): a row range or a block-aligned column range
is the file's own blocks, byte for byte; a column range that cuts a K-quant's 256-value blocks is re-quantized to
Q8_0 from the file's values (within Q8_0's rounding, 2 % of the largest magnitude, as in test_q8_layers.py); a range
that is no whole Q8_0 blocks either is left to mlx's float32 layer (None).

Needs ggml's CPU library (it quantizes the test matrix to Q4_K and holds the slices).
"""

import numpy as np
import pytest

from exo.models.errors import ModelLoadError
from exo.worker.engines.mlx.cpu.ggml_library import Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.gguf_shards import shard_blocks

ROWS, COLUMNS = 8, 512
Q4_K_BLOCK_BYTES = 144  # 256 values a block


def _values(matrix: GgmlMatrix) -> np.ndarray:
    out = np.empty(matrix.shape, dtype=np.float32)
    matrix.dequantize(0, matrix.shape[0], out)
    return out


@pytest.fixture
def q4_k(ggml: Ggml) -> GgmlMatrix:
    matrix = GgmlMatrix(ggml, "Q4_K", ROWS, COLUMNS)
    matrix.fill(0, np.random.default_rng(0).standard_normal((ROWS, COLUMNS)).astype(np.float32))
    return matrix


def test_a_row_range_is_the_files_rows_of_blocks(ggml: Ggml, q4_k: GgmlMatrix) -> None:
    shard = shard_blocks(ggml, q4_k.blocks, "Q4_K", COLUMNS, kind="rows", rank=1, size=2)
    assert shard is not None
    assert (shard.type_name, shard.shape) == ("Q4_K", (4, COLUMNS))
    np.testing.assert_array_equal(shard.blocks, q4_k.blocks[4:])


def test_a_column_range_on_block_boundaries_is_the_files_blocks(ggml: Ggml, q4_k: GgmlMatrix) -> None:
    shard = shard_blocks(ggml, q4_k.blocks, "Q4_K", COLUMNS, kind="columns", rank=1, size=2)
    assert shard is not None
    assert (shard.type_name, shard.shape) == ("Q4_K", (ROWS, 256))
    np.testing.assert_array_equal(shard.blocks, q4_k.blocks[:, Q4_K_BLOCK_BYTES:])
    np.testing.assert_array_equal(_values(shard), _values(q4_k)[:, 256:])


def test_a_column_range_cutting_k_quant_blocks_is_re_quantized_to_q8_0(ggml: Ggml, q4_k: GgmlMatrix) -> None:
    shard = shard_blocks(ggml, q4_k.blocks, "Q4_K", COLUMNS, kind="columns", rank=1, size=4)
    assert shard is not None
    assert (shard.type_name, shard.shape) == ("Q8_0", (ROWS, 128))
    expected = _values(q4_k)[:, 128:256]
    assert float(np.abs(_values(shard) - expected).max()) < 0.02 * float(np.abs(expected).max())


def test_a_column_range_of_no_whole_q8_0_blocks_is_left_float32(ggml: Ggml, q4_k: GgmlMatrix) -> None:
    assert shard_blocks(ggml, q4_k.blocks, "Q4_K", COLUMNS, kind="columns", rank=0, size=32) is None


def test_a_matrix_that_does_not_split_evenly_is_refused(ggml: Ggml, q4_k: GgmlMatrix) -> None:
    with pytest.raises(ModelLoadError, match="do not split by 3"):
        shard_blocks(ggml, q4_k.blocks, "Q4_K", COLUMNS, kind="rows", rank=0, size=3)


def test_two_ranks_column_halves_sum_to_the_whole_product_within_float32_rounding(ggml: Ggml) -> None:
    """What a 2-rank split's sharded-to-all layer computes: each rank's product by its half of the blocks (with its
    half of the input, quantized to the same Q8_0 blocks as the whole input's), then their sum."""
    rng = np.random.default_rng(1)
    whole = GgmlMatrix(ggml, "Q8_0", 64, COLUMNS)
    whole.fill(0, rng.standard_normal((64, COLUMNS)).astype(np.float32))
    x = rng.standard_normal((3, COLUMNS)).astype(np.float32)
    pool = ggml.shared_threadpool(1, 0)
    summed = np.zeros((3, 64), dtype=np.float32)
    for rank in (0, 1):
        half = shard_blocks(ggml, whole.blocks, "Q8_0", COLUMNS, kind="columns", rank=rank, size=2)
        assert half is not None
        np.testing.assert_array_equal(half.blocks, whole.blocks[:, rank * 272 : (rank + 1) * 272])  # 8 blocks of 34
        summed += half.product(np.ascontiguousarray(x[:, rank * 256 : (rank + 1) * 256]), 1, pool)
    expected = whole.product(x, 1, pool)
    assert float(np.abs(summed - expected).max()) < 1e-5 * float(np.abs(expected).max())
