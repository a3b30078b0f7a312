"""A layer's repacked matrices read back into the blocks the file stored, for a pass over many rows (issue 33).

Held repacked (`ggml_repack.py`), a Q4_K matrix multiplies one to 16 rows 1.45-1.69x faster than as stored, and
hundreds of rows 1.4x slower (ggml's repacked kernels against its stored layout's, on the 2-core AVX-512 EPYC). So
a pass of `READ_BACK_ROWS` rows or more (a prefill piece, a group prefill's batch) reads each of its layer's
readable matrices back into one reused buffer and multiplies tensors over it in the stored layout: the 1.5B's 26 MB
of a layer in about 7 ms, against the 66 ms its products gain at 512 rows. Nothing but that buffer is held twice, and it
holds one layer's matrices at a time.
"""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.ggml_graph_ops import GgmlGraphOps
from exo.worker.engines.mlx.cpu.ggml_library import GgmlMatrix


class StoredLayout:
    """The buffer one model's layer passes read matrices back into (grown to the largest layer's, then reused)."""

    def __init__(self) -> None:
        self._buffer: npt.NDArray[np.uint8] | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self._buffer is None else int(self._buffer.nbytes)

    def release(self) -> None:
        """Drop the buffer (the next pass that reads matrices back allocates it again)."""
        self._buffer = None

    def tensors(self, ops: GgmlGraphOps, context: int, matrices: Sequence[GgmlMatrix]) -> dict[int, int]:
        """Tensors in `context` (a context that allocates nothing) over `matrices`' blocks as stored, by the
        matrix's id, for those that read back (the others keep their own tensors); valid until the next call."""
        readable = [matrix for matrix in matrices if matrix.reads_back]
        total = sum(matrix.nbytes for matrix in readable)
        if not readable:
            return {}
        if self._buffer is None or self._buffer.nbytes < total:
            self._buffer = np.empty(total, dtype=np.uint8)
        tensors: dict[int, int] = {}
        offset = 0
        for matrix in readable:
            rows, width = matrix.shape
            region = self._buffer[offset : offset + matrix.nbytes].reshape(rows, matrix.row_bytes)
            # On the calling thread: a second thread, beside ggml's pool spinning after its compute, was no faster
            # (the 1.5B's 28 layers for a 512-token piece of 3.4-3.6 s: 207-218 ms, against 187-199 on one).
            matrix.read_back(region)
            tensor = int(ops.ggml.new_tensor_2d(context, matrix.type, width, rows))
            ops.set_data(tensor, region.ctypes.data)
            tensors[id(matrix)] = tensor
            offset += matrix.nbytes
        return tensors
