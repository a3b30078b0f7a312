"""ggml's CPU matrix products through ctypes, from the shared libraries `ggml_locate` finds (issue 33).

No PyPI package ships ggml prebuilt for Linux, so exo loads the `libggml-base` / `libggml-cpu` of a llama.cpp build.
`GgmlMatrix` holds one weight matrix in a ggml block type (Q8_0 for `--cpu-weights q8_0`) inside a ggml context,
and multiplies float32 activations by it with one `ggml_mul_mat` graph, computed on a persistent thread pool as
llama.cpp computes its own graphs (ggml quantizes the activations to the type's dot-product format itself);
`GgmlProducts` multiplies one input by several matrices in one graph. Only the
functions and the plain structs used here are declared; their layouts are those of ggml.h and ggml-cpu.h.
This module never imports mlx: numpy and ctypes only.
"""

import ctypes
import logging
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.ggml_repack import READ_BACKS, REPACKED_THROUGHOUT, GgmlRepack, ggml_repack

GGML_TYPES: Final[dict[str, int]] = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "BF16": 30,
}
"""`enum ggml_type` values (ggml.h) of the block formats used or measured, and of those a GGUF's matrices are served
in under `--cpu-weights gguf` (the GGUF's own type numbers: gguf's GGMLQuantizationType has the same values)."""
Q8_0: Final = GGML_TYPES["Q8_0"]
Q8_0_BLOCK: Final = 32
"""Weights per Q8_0 block: a float16 scale then 32 int8 values, 34 bytes."""
Q8_0_BLOCK_BYTES: Final = 34
Q8_0_DTYPE: Final = np.dtype([("scale", "<f2"), ("values", "i1", (Q8_0_BLOCK,))])
"""One Q8_0 block as numpy reads it (`block_q8_0` in ggml-common.h: no padding)."""
_MAX_THREADS: Final = 512
"""GGML_MAX_N_THREADS: the length of a thread pool's cpumask."""
_HEADROOM_BYTES: Final = 64 * 1024
"""Room in a context beyond its tensors' data and the graph (ggml aligns each object)."""
_LOG_WARN: Final = 3
"""`GGML_LOG_LEVEL_WARN` (ggml.h): below it, debug and info lines (one per matrix repacked at load) are dropped."""
_LOG_CONT: Final = 5
_LOG_CALLBACK: Final = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

logger = logging.getLogger(__name__)


@_LOG_CALLBACK
def _ggml_log(level: int, text: bytes | None, _: object) -> None:
    """ggml's warnings and errors into the runner's log; its debug and info lines (ggml prints every level to
    stderr by default) nowhere."""
    if _LOG_WARN <= level < _LOG_CONT and text:
        logger.warning("ggml: %s", text.decode(errors="replace").rstrip())


CACHED_ROWS: Final = 16
"""Products over at most this many rows keep their graph (decode steps); longer ones (prefill) build one per call,
whose input and output would otherwise stay allocated for every matrix."""


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class ComputePlan(ctypes.Structure):
    """`struct ggml_cplan`: what `ggml_graph_plan` decides for a graph and a thread count (kept while both are)."""

    _fields_ = [
        ("work_size", ctypes.c_size_t),
        ("work_data", ctypes.c_void_p),
        ("n_threads", ctypes.c_int),
        ("threadpool", ctypes.c_void_p),
        ("abort_callback", ctypes.c_void_p),
        ("abort_callback_data", ctypes.c_void_p),
        ("use_ref", ctypes.c_bool),
    ]


class _TypeTraits(ctypes.Structure):
    """`struct ggml_type_traits` (ggml.h)."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT: Final = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
"""`ggml_to_float_t`: (blocks, float32 destination, values)."""


class _ThreadpoolParams(ctypes.Structure):
    _fields_ = [
        ("cpumask", ctypes.c_bool * _MAX_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


class Ggml:
    """The functions of one build's ggml (base library and CPU backend)."""

    def __init__(self, library_dir: Path) -> None:
        self.library_dir = library_dir
        base = ctypes.CDLL(str(library_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(library_dir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        pointer, size, integer, wide = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64
        self.init = base.ggml_init
        self.init.restype, self.init.argtypes = pointer, [_InitParams]
        self.free = base.ggml_free
        self.free.restype, self.free.argtypes = None, [pointer]
        self.new_tensor_2d = base.ggml_new_tensor_2d
        self.new_tensor_2d.restype, self.new_tensor_2d.argtypes = pointer, [pointer, integer, wide, wide]
        self.get_data = base.ggml_get_data
        self.get_data.restype, self.get_data.argtypes = pointer, [pointer]
        self.mul_mat = base.ggml_mul_mat
        self.mul_mat.restype, self.mul_mat.argtypes = pointer, [pointer, pointer, pointer]
        self.swiglu_split = base.ggml_swiglu_split
        self.swiglu_split.restype, self.swiglu_split.argtypes = pointer, [pointer, pointer, pointer]
        self.new_graph = base.ggml_new_graph
        self.new_graph.restype, self.new_graph.argtypes = pointer, [pointer]
        self.build_forward_expand = base.ggml_build_forward_expand
        self.build_forward_expand.restype, self.build_forward_expand.argtypes = None, [pointer, pointer]
        self.block_size = base.ggml_blck_size
        self.block_size.restype, self.block_size.argtypes = wide, [integer]
        self.type_size = base.ggml_type_size
        self.type_size.restype, self.type_size.argtypes = size, [integer]
        self.row_size = base.ggml_row_size
        self.row_size.restype, self.row_size.argtypes = size, [integer, wide]
        # (type, src, dst, start, nrows, n_per_row, imatrix): rows from src + start into dst + start's row.
        self.quantize_chunk = base.ggml_quantize_chunk
        self.quantize_chunk.restype = size
        self.quantize_chunk.argtypes = [integer, pointer, pointer, wide, wide, wide, pointer]
        self.tensor_overhead = base.ggml_tensor_overhead
        self.tensor_overhead.restype, self.tensor_overhead.argtypes = size, []
        self.graph_overhead = base.ggml_graph_overhead
        self.graph_overhead.restype, self.graph_overhead.argtypes = size, []
        self.type_traits = base.ggml_get_type_traits
        self.type_traits.restype, self.type_traits.argtypes = ctypes.POINTER(_TypeTraits), [integer]
        self._to_float: dict[int, Callable[[int, int, int], None]] = {}
        self.threadpool_params_init = base.ggml_threadpool_params_init
        self.threadpool_params_init.restype = None
        self.threadpool_params_init.argtypes = [ctypes.POINTER(_ThreadpoolParams), integer]
        base.ggml_log_set.restype, base.ggml_log_set.argtypes = None, [_LOG_CALLBACK, ctypes.c_void_p]
        base.ggml_log_set(_ggml_log, None)
        cpu.ggml_cpu_init.restype, cpu.ggml_cpu_init.argtypes = None, []
        cpu.ggml_cpu_init()
        self.threadpool_new = cpu.ggml_threadpool_new
        self.threadpool_new.restype = pointer
        self.threadpool_new.argtypes = [ctypes.POINTER(_ThreadpoolParams)]
        self.threadpool_free = cpu.ggml_threadpool_free
        self.threadpool_free.restype, self.threadpool_free.argtypes = None, [pointer]
        self.graph_plan = cpu.ggml_graph_plan
        self.graph_plan.restype, self.graph_plan.argtypes = ComputePlan, [pointer, integer, pointer]
        self.graph_compute = cpu.ggml_graph_compute
        self.graph_compute.restype, self.graph_compute.argtypes = integer, [pointer, ctypes.POINTER(ComputePlan)]
        self._pools: dict[tuple[int, int | None], int] = {}

    def fits(self, type_name: str, in_features: int) -> bool:
        """Whether rows of `in_features` values split into whole blocks of the type (K-quants take 256 values a
        block: the default model's 896-wide rows are stored as Q5_0/Q8_0 in its GGUF for that reason)."""
        return in_features % int(self.block_size(GGML_TYPES[type_name])) == 0

    def to_float(self, type_id: int) -> Callable[[int, int, int], None]:
        """ggml's own dequantizer of a block type (`ggml_get_type_traits(type)->to_float`): (blocks' address,
        float32 destination's address, values). Raises ValueError for a type without one (F32 needs none)."""
        function = self._to_float.get(type_id)
        if function is None:
            address = self.type_traits(type_id).contents.to_float
            if not address:
                raise ValueError(f"ggml type {type_id} has no to_float")
            function = self._to_float[type_id] = _TO_FLOAT(address)
        return function

    def new_threadpool(self, threads: int, poll: int | None = None) -> int:
        """A new pool of `threads` threads; `poll` (0–100) is how long its idle threads spin before they sleep
        (None: ggml's default)."""
        params = _ThreadpoolParams()
        self.threadpool_params_init(ctypes.byref(params), threads)
        if poll is not None:
            params.poll = poll
        pool = self.threadpool_new(ctypes.byref(params))
        if not pool:
            raise RuntimeError("ggml_threadpool_new failed")
        return int(pool)

    def shared_threadpool(self, threads: int, poll: int | None = None) -> int:
        """The process's one pool of this size and polling (made on first use, kept for the process's life)."""
        key = (threads, poll)
        if key not in self._pools:
            self._pools[key] = self.new_threadpool(threads, poll)
        return self._pools[key]

    def new_context(self, size: int, *, allocates: bool = True) -> int:
        """A context of `size` bytes (plus headroom); without `allocates` its tensors get no data (a graph
        allocator's, or memory the caller points them at)."""
        context = self.init(_InitParams(mem_size=size + _HEADROOM_BYTES, mem_buffer=None, no_alloc=not allocates))
        if not context:
            raise MemoryError(f"ggml_init could not allocate {size} bytes")
        return int(context)


def q8_0_to_float32(blocks: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """Rows of Q8_0 blocks (rows × 34·blocks bytes) back to float32 (rows × 32·blocks): scale × value."""
    rows = blocks.shape[0]
    parsed = np.ascontiguousarray(blocks).view(Q8_0_DTYPE)  # rows × blocks
    values = parsed["values"].astype(np.float32)
    values *= parsed["scale"].astype(np.float32)[..., None]
    return values.reshape(rows, -1)


class PackedLayout(Protocol):
    """A layout of exo's own that a matrix's blocks are packed into at load (`rows_kernel.py`: Q6_K, sixteen outputs'
    values already in a register's lanes), read only by the products it adds to a graph."""

    def packs(self, type_name: str, out_features: int, in_features: int) -> bool:
        """Whether a matrix of this type and shape can be held packed here."""
        ...

    def pack(self, type_name: str, blocks: npt.NDArray[np.uint8], destination: int, in_features: int) -> None:
        """`blocks` (out × row bytes, C-contiguous, as a GGUF stores them; rows of `in_features` values) packed into
        as many bytes at `destination`."""
        ...

    def packed_product(self, ggml: "Ggml", context: int, weight: int, x: int, *, out_features: int, rows: int) -> int:
        """A packed `weight` (in × out) times x (in × rows, float32): the float32 (out × rows) node."""
        ...


class _Graph:
    """Product nodes (`GgmlMatrix.product_node`) of one or more weight matrices over one shared input of a fixed
    number of rows, in a context of its own (input, outputs and graph): one compute call multiplies the input by every
    matrix."""

    def __init__(self, matrices: "Sequence[GgmlMatrix]", rows: int, *, swiglu: bool = False) -> None:
        """`matrices`: of one ggml library and one width (`GgmlProducts` checks). With `swiglu`, the matrices are
        an MLP's gate, up and down (`GgmlSwiGluMlp` checks) and the graph's one output is
        down · (silu(x · gateᵀ) ⊙ (x · upᵀ)), computed in the one graph."""
        ggml = matrices[0].ggml
        in_features = matrices[0].shape[1]
        self.rows = rows
        self._ggml = ggml
        floats = 4 * rows * (in_features + sum(matrix.shape[0] for matrix in matrices) + swiglu * matrices[0].shape[0])
        objects = 2 + len(matrices) + swiglu  # the input, the outputs (and the gated product) and the graph
        self._context = ggml.new_context(floats + objects * ggml.tensor_overhead() + ggml.graph_overhead())
        source = ggml.new_tensor_2d(self._context, GGML_TYPES["F32"], in_features, rows)
        if swiglu:
            gate, up, down = matrices
            gated = ggml.swiglu_split(
                self._context,
                gate.product_node(self._context, source, rows),
                up.product_node(self._context, source, rows),
            )
            results = [down.product_node(self._context, gated, rows)]
            outputs = [down]
        else:
            results = [matrix.product_node(self._context, source, rows) for matrix in matrices]
            outputs = list(matrices)
        self._graph = ggml.new_graph(self._context)
        for result in results:
            ggml.build_forward_expand(self._graph, result)
        self._input = int(ggml.get_data(source))
        self._outputs = [
            (int(ggml.get_data(result)), matrix.shape[0]) for result, matrix in zip(results, outputs, strict=True)
        ]
        self._work: ctypes.Array[ctypes.c_char] | None = None
        self._plan_key: tuple[int, int] | None = None
        self._plan = ComputePlan()

    def run(self, x: npt.NDArray[np.float32], threads: int, pool: int) -> list[npt.NDArray[np.float32]]:
        """x (rows × in, C-contiguous float32) times every matrix: one new array (rows × out) per matrix."""
        if self._plan_key != (threads, pool):
            self._plan = self._ggml.graph_plan(self._graph, threads, pool)
            self._work = ctypes.create_string_buffer(max(int(self._plan.work_size), 1))
            self._plan.work_data = ctypes.addressof(self._work)
            self._plan_key = (threads, pool)
        ctypes.memmove(self._input, x.ctypes.data, x.nbytes)
        status = self._ggml.graph_compute(self._graph, ctypes.byref(self._plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned {status}")
        results: list[npt.NDArray[np.float32]] = []
        for address, out in self._outputs:
            result = np.empty((self.rows, out), dtype=np.float32)
            ctypes.memmove(result.ctypes.data, address, result.nbytes)
            results.append(result)
        return results

    def close(self) -> None:
        self._ggml.free(self._context)


def _run_cached(
    graphs: dict[int, _Graph],
    matrices: "Sequence[GgmlMatrix]",
    x: npt.NDArray[np.float32],
    *,
    threads: int,
    pool: int,
    swiglu: bool = False,
) -> list[npt.NDArray[np.float32]]:
    """Run the graph of `matrices` (`_Graph`'s `swiglu`: an MLP's) for x's row count: kept in `graphs` up to
    `CACHED_ROWS` rows, else built and freed here."""
    source = np.ascontiguousarray(x, dtype=np.float32)
    rows, width = source.shape
    if width != matrices[0].shape[1]:
        raise ValueError(f"rows of {width} values times matrices of width {matrices[0].shape[1]}")
    graph = graphs.get(rows)
    if graph is not None:
        return graph.run(source, threads, pool)
    graph = _Graph(matrices, rows, swiglu=swiglu)
    if rows <= CACHED_ROWS:
        graphs[rows] = graph
        return graph.run(source, threads, pool)
    try:
        return graph.run(source, threads, pool)
    finally:
        graph.close()


class GgmlMatrix:
    """A weight matrix (out × in) held in a ggml block type in a ggml context of its own; `product` is y = x · Wᵀ.

    Filled a slice of rows at a time (`fill`) from float32, so the caller never holds the whole matrix in float32.
    """

    def __init__(
        self, ggml: Ggml, type_name: str, out_features: int, in_features: int, *, repack: GgmlRepack | None = None
    ) -> None:
        """An empty matrix in its own context, or (`repack`) in a buffer of ggml's repack type (`repacked`)."""
        if not ggml.fits(type_name, in_features):
            raise ValueError(f"{type_name} blocks do not divide rows of {in_features} values")
        self.ggml = ggml
        self.type_name = type_name
        self.type = GGML_TYPES[type_name]
        self.shape = (out_features, in_features)
        self.row_bytes = int(ggml.row_size(self.type, in_features))
        self.nbytes = self.row_bytes * out_features
        self.repacked = repack is not None
        """Held interleaved for ggml's kernels (`ggml_repack.py`): products, and `read_back` where `reads_back`."""
        self.reads_back = False
        """Repacked in a layout `read_back` restores exactly (checked on the file's own blocks at load)."""
        self.packed_by: PackedLayout | None = None
        """The layout of exo's own its blocks are packed into (`packed_from_blocks`), whose products alone read it."""
        size = ggml.tensor_overhead() + (0 if repack else self.nbytes)
        self._context = ggml.new_context(size, allocates=repack is None)
        self._weight = int(ggml.new_tensor_2d(self._context, self.type, in_features, out_features))
        self._buffer = 0 if repack is None else repack.allocate(self._context)
        if repack is not None and not self._buffer:
            ggml.free(self._context)
            raise MemoryError(f"ggml could not allocate a repacked {type_name} matrix of {self.nbytes} bytes")
        self._data = int(ggml.get_data(self._weight))
        self._graphs: dict[int, _Graph] = {}
        # The context (and the repack buffer) own the weights; freed with this object (its graphs first).
        self._finalizer = weakref.finalize(self, _free_all, ggml, self._graphs, self._context, self._buffer, repack)

    @classmethod
    def from_blocks(
        cls, ggml: Ggml, type_name: str, out_features: int, in_features: int, blocks: npt.NDArray[np.uint8]
    ) -> "GgmlMatrix":
        """A matrix holding `blocks` as they are: rows of the type's blocks as a GGUF stores them (out × row bytes,
        any array whose bytes those are), copied once into the matrix's context, never re-quantized."""
        matrix, raw = cls._sized_for(ggml, type_name, out_features, in_features, blocks)
        ctypes.memmove(matrix._data, raw.ctypes.data, raw.nbytes)
        return matrix

    @classmethod
    def _sized_for(
        cls, ggml: Ggml, type_name: str, out_features: int, in_features: int, blocks: npt.NDArray[np.uint8]
    ) -> "tuple[GgmlMatrix, npt.NDArray[np.uint8]]":
        """An empty matrix of this type and shape, and `blocks` as its rows of bytes (out × row bytes, C-contiguous);
        ValueError where they are not that matrix's bytes."""
        matrix = cls(ggml, type_name, out_features, in_features)
        raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
        if raw.nbytes != matrix.nbytes:
            matrix.close()
            raise ValueError(
                f"{raw.nbytes} bytes are not a {type_name} matrix of {out_features} × {in_features} "
                f"({matrix.nbytes} bytes)"
            )
        return matrix, raw.reshape(out_features, matrix.row_bytes)

    @classmethod
    def repacked_from_blocks(
        cls,
        ggml: Ggml,
        type_name: str,
        out_features: int,
        in_features: int,
        blocks: npt.NDArray[np.uint8],
        *,
        measured_only: bool = False,
    ) -> "GgmlMatrix | None":
        """A matrix of `blocks` (as `from_blocks` takes them) held interleaved for ggml's kernels, the way llama.cpp
        holds it; None where ggml has no such layout for this type and row count on this CPU, or no repack buffer
        type, or (`measured_only`) where the type is not one measured to pay repacked throughout and its layout
        cannot be read back into exactly these blocks (the caller holds the blocks as stored)."""
        repack = ggml_repack(ggml.library_dir)
        if repack is None:
            return None
        matrix = cls(ggml, type_name, out_features, in_features, repack=repack)
        raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
        if not repack.chose_layout(matrix._weight) or raw.nbytes != matrix.nbytes:
            matrix.close()
            return None
        repack.set(matrix._weight, raw.ctypes.data, raw.nbytes)
        matrix.reads_back = matrix._reads_back_as(raw)
        if measured_only and not (matrix.reads_back or type_name in REPACKED_THROUGHOUT):
            matrix.close()
            return None
        return matrix

    @classmethod
    def packed_from_blocks(
        cls,
        ggml: Ggml,
        type_name: str,
        out_features: int,
        in_features: int,
        blocks: npt.NDArray[np.uint8],
        *,
        layout: PackedLayout,
    ) -> "GgmlMatrix | None":
        """A matrix of `blocks` (as `from_blocks` takes them) packed into `layout`, the same bytes rearranged; None
        where the layout takes no matrix of this type and shape."""
        if not layout.packs(type_name, out_features, in_features):
            return None
        matrix, raw = cls._sized_for(ggml, type_name, out_features, in_features, blocks)
        layout.pack(type_name, raw, matrix._data, in_features)
        matrix.packed_by = layout
        return matrix

    @property
    def holds_stored_blocks(self) -> bool:
        """Whether its bytes are the blocks as a GGUF stores them (neither repacked by ggml nor packed by exo)."""
        return not self.repacked and self.packed_by is None

    def product_node(self, context: int, x: int, rows: int) -> int:
        """This matrix times x (in × rows, float32) as a node of a graph in `context`: ggml's `ggml_mul_mat`, or the
        packed layout's own product where the blocks are packed."""
        if self.packed_by is None:
            return int(self.ggml.mul_mat(context, self._weight, x))
        return self.packed_by.packed_product(self.ggml, context, self._weight, x, out_features=self.shape[0], rows=rows)

    def _reads_back_as(self, raw: npt.NDArray[np.uint8]) -> bool:
        """Whether the type's read-back turns the repacked bytes into exactly `raw`, the blocks as stored."""
        read_back = READ_BACKS.get(self.type_name)
        if read_back is None:
            return False
        restored = np.empty((self.shape[0], self.row_bytes), dtype=np.uint8)
        try:
            read_back(self._bytes(), restored)
        except ValueError:
            return False
        return bool(np.array_equal(restored.reshape(-1), raw))

    def read_back(self, out: npt.NDArray[np.uint8]) -> None:
        """A repacked matrix's blocks as stored into `out` (out × row_bytes, C-contiguous); only where
        `reads_back`."""
        if not self.reads_back:
            raise ValueError(f"this {self.type_name} matrix is not held in a layout exo reads back")
        READ_BACKS[self.type_name](self._bytes(), out)

    def _bytes(self) -> npt.NDArray[np.uint8]:
        return np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self._data))

    @property
    def blocks(self) -> npt.NDArray[np.uint8]:
        """The stored blocks, a view (out × row_bytes) into the context: valid while this object lives."""
        self._refuse_if_repacked("its blocks read")
        buffer = (ctypes.c_uint8 * self.nbytes).from_address(self._data)
        return np.ctypeslib.as_array(buffer).reshape(self.shape[0], self.row_bytes)

    def fill(self, start: int, rows: npt.NDArray[np.float32]) -> None:
        """Quantize float32 rows into rows [start, start + len(rows)) of the matrix."""
        self._refuse_if_repacked("filled")
        source = np.ascontiguousarray(rows, dtype=np.float32)
        count, width = source.shape
        if width != self.shape[1] or not 0 <= start <= self.shape[0] - count:
            raise ValueError(f"rows {start}..{start + count} of width {width} do not fit a {self.shape} matrix")
        destination = self._data + start * self.row_bytes
        self.ggml.quantize_chunk(self.type, source.ctypes.data, destination, 0, count, width, None)

    def dequantize(self, start: int, stop: int, out: npt.NDArray[np.float32]) -> None:
        """Rows [start, stop) of the matrix in float32 into `out` (C-contiguous, at least (stop - start) × in values),
        by ggml's own dequantizer of the type (a copy for F32): exactly the values its blocks hold."""
        self._refuse_if_repacked("dequantized")
        count = stop - start
        values = count * self.shape[1]
        if not 0 <= start <= stop <= self.shape[0] or out.dtype != np.float32 or out.size < values:
            raise ValueError(f"rows {start}..{stop} of a {self.shape} matrix do not fit {out.size} float32 values")
        if not out.flags.c_contiguous:
            raise ValueError("dequantize writes into a C-contiguous array")
        source = self._data + start * self.row_bytes
        if self.type == GGML_TYPES["F32"]:
            ctypes.memmove(out.ctypes.data, source, values * 4)
        else:
            self.ggml.to_float(self.type)(source, out.ctypes.data, values)

    def product(self, x: npt.NDArray[np.float32], threads: int, pool: int) -> npt.NDArray[np.float32]:
        """x (rows × in) · Wᵀ: (rows × out) in float32, on `threads` threads of `pool`."""
        return _run_cached(self._graphs, [self], x, threads=threads, pool=pool)[0]

    @property
    def tensor(self) -> int:
        """The matrix's ggml tensor (in this matrix's context: valid while it lives)."""
        return self._weight

    def close(self) -> None:
        """Free the context now (else when this object is collected); the matrix is unusable afterwards."""
        self._finalizer()

    def _refuse_if_repacked(self, what: str) -> None:
        if not self.holds_stored_blocks:
            held = "repacked" if self.repacked else "packed"
            raise ValueError(f"a {held} {self.type_name} matrix cannot be {what}: it holds no blocks as stored")


class GgmlProducts:
    """Several matrices multiplied by one input in one ggml graph (attention's q/k/v projections, the MLP's gate and
    up): one compute call, one copy of the input and one wake-up of the pool for all of them, where separate
    products pay each once per matrix. The matrices may hold different block types; each product is the one its
    matrix's `product` computes (the same kernel over the same rows). The matrices must outlive this object."""

    def __init__(self, matrices: Sequence[GgmlMatrix]) -> None:
        if not matrices:
            raise ValueError("no matrices to multiply")
        widths = {matrix.shape[1] for matrix in matrices}
        if len(widths) != 1 or len({id(matrix.ggml) for matrix in matrices}) != 1:
            raise ValueError(f"matrices of widths {sorted(widths)} or of different ggml libraries share no input")
        self.matrices = tuple(matrices)
        self._graphs: dict[int, _Graph] = {}
        self._finalizer = weakref.finalize(self, _free_graphs, self._graphs)

    def products(self, x: npt.NDArray[np.float32], threads: int, pool: int) -> list[npt.NDArray[np.float32]]:
        """x (rows × in) times each matrix: one (rows × out) float32 array per matrix, in order."""
        return _run_cached(self._graphs, self.matrices, x, threads=threads, pool=pool)

    def close(self) -> None:
        """Free the graphs now (else when this object is collected)."""
        self._finalizer()


class GgmlSwiGluMlp:
    """A SwiGLU MLP's three matrices in one ggml graph: down · (silu(x · gateᵀ) ⊙ (x · upᵀ)), as mlx-lm's qwen2 and
    llama MLPs compute it. One compute call for the whole MLP where the products apart pay two (and, in the model,
    an `mx.eval` of the gated product in between); the gate and up products are those their matrices compute alone,
    the gating is ggml's `swiglu` op (float32), and down quantizes its input as its product alone does. The matrices
    must outlive this object."""

    def __init__(self, gate: GgmlMatrix, up: GgmlMatrix, down: GgmlMatrix) -> None:
        if gate.shape != up.shape or down.shape[1] != gate.shape[0] or len({id(m.ggml) for m in (gate, up, down)}) != 1:
            raise ValueError(
                f"gate {gate.shape}, up {up.shape} and down {down.shape} are not one MLP's matrices of one ggml library"
            )
        self.matrices = (gate, up, down)
        self._graphs: dict[int, _Graph] = {}
        self._finalizer = weakref.finalize(self, _free_graphs, self._graphs)

    def product(self, x: npt.NDArray[np.float32], threads: int, pool: int) -> npt.NDArray[np.float32]:
        """The MLP of x (rows × in): (rows × in) float32."""
        return _run_cached(self._graphs, self.matrices, x, threads=threads, pool=pool, swiglu=True)[0]

    @property
    def kept_row_counts(self) -> list[int]:
        """The row counts whose graphs are kept (those run so far up to `CACHED_ROWS`)."""
        return sorted(self._graphs)

    def close(self) -> None:
        """Free the graphs now (else when this object is collected)."""
        self._finalizer()


def _free_graphs(graphs: dict[int, _Graph]) -> None:
    for graph in graphs.values():
        graph.close()
    graphs.clear()


def _free_all(ggml: Ggml, graphs: dict[int, _Graph], context: int, buffer: int, repack: GgmlRepack | None) -> None:
    _free_graphs(graphs)
    if repack is not None and buffer:
        repack.free(buffer)
    ggml.free(context)
