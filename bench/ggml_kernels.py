"""ggml's CPU matrix products for the kernel bench, from the shared libraries the llama.cpp build leaves in `build/`.

The binding itself is the engine's (`exo.worker.engines.mlx.cpu.ggml_library`): one `GgmlProduct` here is one
`GgmlMatrix` (weights in a GGUF block type, quantized from float32 by ggml) multiplied over a fixed number of rows on
a thread pool of its own, as the bench compares candidates one at a time. `RowsProduct` is the same matrix multiplied
by exo's multi-row kernel (`rows_kernel.py`, built by `exo ggml build` beside exo's ggml of the same release, whose
tensor layout it shares) as a node of a ggml graph, as the engine's decode graph runs it.
"""

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.ggml_graph_ops import graph_ops
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES, ComputePlan, Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.rows_kernel import RowsKernel

__all__ = ["GGML_TYPES", "Ggml", "GgmlProduct", "RowsProduct", "ggml_library_dir"]


def ggml_library_dir(binary: Path) -> Path:
    """Where the shared libraries of a llama.cpp build are: beside its `llama-server`."""
    return binary.parent


def _filled(
    ggml: Ggml,
    weights: npt.NDArray[np.float32],
    type_name: str,
    *,
    repacked: bool,
    packed_by: RowsKernel | None = None,
) -> GgmlMatrix:
    """`weights` quantized by ggml to `type_name`, held as stored, (`repacked`) in ggml's interleaved layout or
    (`packed_by`) packed into exo's kernel's own layout."""
    out_features, in_features = weights.shape
    matrix = GgmlMatrix(ggml, type_name, out_features, in_features)
    matrix.fill(0, weights)
    if not repacked and packed_by is None:
        return matrix
    if packed_by is not None:
        held = GgmlMatrix.packed_from_blocks(
            ggml, type_name, out_features, in_features, matrix.blocks, layout=packed_by
        )
    else:
        held = GgmlMatrix.repacked_from_blocks(ggml, type_name, out_features, in_features, matrix.blocks)
    matrix.close()
    if held is None:
        raise ValueError(f"no {'packed' if packed_by else 'repacked'} layout of {type_name} for this shape on this CPU")
    return held


@dataclass
class GgmlProduct:
    """y = x · Wᵀ with W stored in a GGUF block type, computed again and again over `rows` rows."""

    matrix: GgmlMatrix
    type_name: str
    rows: int
    threads: int
    _pool: int = field(repr=False)

    @property
    def weight_bytes(self) -> int:
        return self.matrix.nbytes

    @classmethod
    def create(
        cls,
        ggml: Ggml,
        weights: npt.NDArray[np.float32],
        type_name: str,
        rows: int,
        threads: int,
        *,
        repacked: bool = False,
    ) -> "GgmlProduct":
        """`repacked`: the matrix held in ggml's interleaved layout (as llama.cpp and the engine hold Q4_K)."""
        matrix = _filled(ggml, weights, type_name, repacked=repacked)
        return cls(matrix=matrix, type_name=type_name, rows=rows, threads=threads, _pool=ggml.new_threadpool(threads))

    def run(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The (rows × out) product of `x` (rows × in)."""
        if x.shape[0] != self.rows:
            raise ValueError(f"this product takes {self.rows} rows, not {x.shape[0]}")
        return self.matrix.product(x, self.threads, self._pool)

    def close(self) -> None:
        self.matrix.close()
        self.matrix.ggml.threadpool_free(self._pool)


@dataclass
class RowsProduct:
    """y = x · Wᵀ by exo's multi-row kernel: W in a block type the kernel takes, over `rows` rows, one custom node
    of a graph built once (its input written and its output read each run)."""

    matrix: GgmlMatrix
    rows: int
    _context: int = field(repr=False)
    _graph: int = field(repr=False)
    _input: int = field(repr=False)
    _output: int = field(repr=False)
    _pool: int = field(repr=False)
    _plan: ComputePlan = field(repr=False)
    _work: ctypes.Array[ctypes.c_char] = field(repr=False)

    @property
    def weight_bytes(self) -> int:
        return self.matrix.nbytes

    @classmethod
    def create(
        cls,
        ggml: Ggml,
        kernel: RowsKernel,
        weights: npt.NDArray[np.float32],
        *,
        type_name: str,
        rows: int,
        threads: int,
        repacked: bool = False,
        packed: bool = False,
    ) -> "RowsProduct":
        """`repacked`: the matrix held in ggml's interleaved layout (as the engine holds Q4_K); `packed`: in the
        kernel's own layout (as the engine holds Q6_K); else as stored."""
        out_features, in_features = weights.shape
        matrix = _filled(ggml, weights, type_name, repacked=repacked, packed_by=kernel if packed else None)
        floats = 4 * rows * (in_features + out_features)
        context = ggml.new_context(floats + 4 * int(ggml.tensor_overhead()) + int(ggml.graph_overhead()))
        source = ggml.new_tensor_2d(context, GGML_TYPES["F32"], in_features, rows)
        if packed:
            node = matrix.product_node(context, source, rows)
        else:
            node = kernel.product(graph_ops(ggml), context, matrix.tensor, source, out_features=out_features, rows=rows)
        graph = ggml.new_graph(context)
        ggml.build_forward_expand(graph, node)
        pool = ggml.new_threadpool(threads)
        plan = ggml.graph_plan(graph, threads, pool)
        work = ctypes.create_string_buffer(max(int(plan.work_size), 1))
        plan.work_data = ctypes.addressof(work)
        return cls(
            matrix=matrix,
            rows=rows,
            _context=context,
            _graph=graph,
            _input=int(ggml.get_data(source)),
            _output=int(ggml.get_data(node)),
            _pool=pool,
            _plan=plan,
            _work=work,
        )

    def run(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        source = np.ascontiguousarray(x, dtype=np.float32)
        if source.shape != (self.rows, self.matrix.shape[1]):
            raise ValueError(f"this product takes {self.rows} rows of {self.matrix.shape[1]}, not {source.shape}")
        ctypes.memmove(self._input, source.ctypes.data, source.nbytes)
        if self.matrix.ggml.graph_compute(self._graph, ctypes.byref(self._plan)) != 0:
            raise RuntimeError("ggml_graph_compute failed")
        result = np.empty((self.rows, self.matrix.shape[0]), dtype=np.float32)
        ctypes.memmove(result.ctypes.data, self._output, result.nbytes)
        return result

    def close(self) -> None:
        ggml = self.matrix.ggml
        ggml.free(self._context)
        self.matrix.close()
        ggml.threadpool_free(self._pool)
