"""A tensor rank's slice of a GGUF matrix, in blocks (`--cpu-weights gguf` with `--parallel tensor`).

An all-to-sharded layer (q/k/v, gate/up) holds a range of the matrix's output rows: a range of its rows of blocks,
whatever the type. A sharded-to-all layer (o_proj, down_proj) holds a range of the input columns; the blocks run along
the input, so the range is a range of each row's blocks only where it starts and ends on a block boundary (every
32 values for Q4_0/Q5_0/Q8_0, 256 for the K-quants, any value for F16/BF16/F32). Where it does not (a K-quant down_proj
of 4864 columns over 2 ranks: 2432 each), this rank's columns are dequantized from the file's blocks a few rows at a
time and re-quantized to Q8_0 (8.5 bits a weight: at least the precision of the file's type, more memory than a K-quant
takes); where the range is no whole Q8_0 blocks either, the caller leaves mlx's float32 layer in place.
"""

from typing import Literal

import gguf
import numpy as np
import numpy.typing as npt

from exo.models.errors import ModelLoadError
from exo.worker.engines.mlx.cpu.ggml_library import Q8_0_BLOCK, Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.int8_layers import CONVERSION_ROWS

ShardKind = Literal["rows", "columns"]
"""Which range of a matrix a rank holds: output rows (all-to-sharded) or input columns (sharded-to-all)."""


def shard_blocks(
    ggml: Ggml,
    rows: npt.NDArray[np.uint8],
    type_name: str,
    in_features: int,
    *,
    kind: ShardKind,
    rank: int,
    size: int,
) -> GgmlMatrix | None:
    """Rank `rank`'s of `size` equal slices (`kind`) of the matrix whose raw blocks are `rows` (one row of blocks per
    output row, `in_features` values each) as a ggml matrix: in the file's type where the slice is whole blocks, else
    re-quantized to Q8_0; None where the slice is no whole Q8_0 blocks either."""
    out_features = rows.shape[0]
    extent = out_features if kind == "rows" else in_features
    if extent % size:
        raise ModelLoadError(
            f"a {type_name} matrix of {out_features} x {in_features} has {kind} that do not split by {size}"
        )
    width = extent // size
    start = rank * width
    if kind == "rows":
        return GgmlMatrix.from_blocks(ggml, type_name, width, in_features, rows[start : start + width])
    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    if start % block == 0 and width % block == 0:
        first, stop = start // block * block_bytes, (start + width) // block * block_bytes
        return GgmlMatrix.from_blocks(ggml, type_name, out_features, width, rows[:, first:stop])
    if width % Q8_0_BLOCK:
        return None
    matrix = GgmlMatrix(ggml, "Q8_0", out_features, width)
    for first_row in range(0, out_features, CONVERSION_ROWS):
        piece = rows[first_row : first_row + CONVERSION_ROWS]
        values: npt.NDArray[np.float32] = gguf.quants.dequantize(piece, gguf.GGMLQuantizationType[type_name])
        matrix.fill(first_row, values.astype(np.float32, copy=False)[:, start : start + width])
    return matrix
