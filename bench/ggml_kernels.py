"""ggml's CPU matrix products through ctypes, from the shared libraries the llama.cpp build leaves in `build/`.

No PyPI package ships ggml prebuilt for Linux (ggml-python and llama-cpp-python are source packages that compile it,
as long a build as llama-server's), so the bench reuses the `libggml-base.so` / `libggml-cpu.so` that
`bench.llama_cpp_build` builds anyway. One `GgmlProduct` is one `ggml_mul_mat` graph (weights in a GGUF block type,
float32 activations, which ggml quantizes to its dot-product type itself), computed on a persistent thread pool as
llama.cpp computes its own graphs. Only the few functions and the two plain structs used here are declared.
"""

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

GGML_TYPES: dict[str, int] = {"F32": 0, "Q4_0": 2, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
"""`enum ggml_type` values (ggml.h) of the block formats measured."""
_THREADPOOL_PARAMS_BYTES = 1024
"""Room for `struct ggml_threadpool_params` (512 bools, three ints, two bools: 530 bytes), filled by ggml itself."""
_HEADROOM_BYTES = 1 << 20


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class _ComputePlan(ctypes.Structure):
    _fields_ = [
        ("work_size", ctypes.c_size_t),
        ("work_data", ctypes.c_void_p),
        ("n_threads", ctypes.c_int),
        ("threadpool", ctypes.c_void_p),
        ("abort_callback", ctypes.c_void_p),
        ("abort_callback_data", ctypes.c_void_p),
        ("use_ref", ctypes.c_bool),
    ]


def ggml_library_dir(binary: Path) -> Path:
    """Where the shared libraries of a llama.cpp build are: beside its `llama-server`."""
    return binary.parent


class Ggml:
    """The functions of one build's ggml (base and CPU backend)."""

    def __init__(self, library_dir: Path) -> None:
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
        self.new_graph = base.ggml_new_graph
        self.new_graph.restype, self.new_graph.argtypes = pointer, [pointer]
        self.build_forward_expand = base.ggml_build_forward_expand
        self.build_forward_expand.restype, self.build_forward_expand.argtypes = None, [pointer, pointer]
        self.block_size = base.ggml_blck_size
        self.block_size.restype, self.block_size.argtypes = wide, [integer]
        self.row_size = base.ggml_row_size
        self.row_size.restype, self.row_size.argtypes = size, [integer, wide]
        self.quantize_chunk = base.ggml_quantize_chunk
        self.quantize_chunk.restype = size
        self.quantize_chunk.argtypes = [integer, pointer, pointer, wide, wide, wide, pointer]
        self.tensor_overhead = base.ggml_tensor_overhead
        self.tensor_overhead.restype, self.tensor_overhead.argtypes = size, []
        self.graph_overhead = base.ggml_graph_overhead
        self.graph_overhead.restype, self.graph_overhead.argtypes = size, []
        self.threadpool_params_init = base.ggml_threadpool_params_init
        self.threadpool_params_init.restype, self.threadpool_params_init.argtypes = None, [pointer, integer]
        cpu.ggml_cpu_init.restype, cpu.ggml_cpu_init.argtypes = None, []
        cpu.ggml_cpu_init()
        self.threadpool_new = cpu.ggml_threadpool_new
        self.threadpool_new.restype, self.threadpool_new.argtypes = pointer, [pointer]
        self.threadpool_free = cpu.ggml_threadpool_free
        self.threadpool_free.restype, self.threadpool_free.argtypes = None, [pointer]
        self.graph_plan = cpu.ggml_graph_plan
        self.graph_plan.restype, self.graph_plan.argtypes = _ComputePlan, [pointer, integer, pointer]
        self.graph_compute = cpu.ggml_graph_compute
        self.graph_compute.restype, self.graph_compute.argtypes = integer, [pointer, ctypes.POINTER(_ComputePlan)]

    def fits(self, type_name: str, in_features: int) -> bool:
        """Whether rows of `in_features` values split into whole blocks of the type (K-quants take 256 values a
        block: the default model's 896-wide rows are stored as Q5_0/Q8_0 in its GGUF for that reason)."""
        return in_features % int(self.block_size(GGML_TYPES[type_name])) == 0

    def new_threadpool(self, threads: int) -> int:
        params = ctypes.create_string_buffer(_THREADPOOL_PARAMS_BYTES)
        self.threadpool_params_init(ctypes.addressof(params), threads)
        pool = self.threadpool_new(ctypes.addressof(params))
        if not pool:
            raise RuntimeError("ggml_threadpool_new failed")
        return int(pool)


@dataclass
class GgmlProduct:
    """y = x · Wᵀ with W stored in a GGUF block type, as one ggml graph that `run` computes again and again."""

    ggml: Ggml
    type_name: str
    weight_bytes: int
    rows: int
    out_features: int
    _context: int
    _graph: int
    _plan: _ComputePlan
    _work: ctypes.Array[ctypes.c_char]
    _input: int
    _output: int
    _pool: int

    @classmethod
    def create(
        cls, ggml: Ggml, weights: npt.NDArray[np.float32], type_name: str, rows: int, threads: int
    ) -> "GgmlProduct":
        out_features, in_features = weights.shape
        if not ggml.fits(type_name, in_features):
            raise ValueError(f"{type_name} blocks do not divide rows of {in_features} values")
        kind = GGML_TYPES[type_name]
        weight_bytes = int(ggml.row_size(kind, in_features)) * out_features
        floats = 4 * rows * (in_features + out_features)
        size = weight_bytes + floats + 4 * ggml.tensor_overhead() + ggml.graph_overhead() + _HEADROOM_BYTES
        context = ggml.init(_InitParams(mem_size=size, mem_buffer=None, no_alloc=False))
        if not context:
            raise MemoryError(f"ggml_init could not allocate {size} bytes")
        weight_tensor = ggml.new_tensor_2d(context, kind, in_features, out_features)
        source = np.ascontiguousarray(weights, dtype=np.float32)
        data = ggml.get_data(weight_tensor)
        if kind == GGML_TYPES["F32"]:
            ctypes.memmove(data, source.ctypes.data, source.nbytes)
        else:
            ggml.quantize_chunk(kind, source.ctypes.data, data, 0, out_features, in_features, None)
        input_tensor = ggml.new_tensor_2d(context, GGML_TYPES["F32"], in_features, rows)
        output_tensor = ggml.mul_mat(context, weight_tensor, input_tensor)
        graph = ggml.new_graph(context)
        ggml.build_forward_expand(graph, output_tensor)
        pool = ggml.new_threadpool(threads)
        plan = ggml.graph_plan(graph, threads, pool)
        work = ctypes.create_string_buffer(max(int(plan.work_size), 1))
        plan.work_data = ctypes.addressof(work)
        return cls(
            ggml=ggml,
            type_name=type_name,
            weight_bytes=weight_bytes,
            rows=rows,
            out_features=out_features,
            _context=int(context),
            _graph=int(graph),
            _plan=plan,
            _work=work,
            _input=int(ggml.get_data(input_tensor)),
            _output=int(ggml.get_data(output_tensor)),
            _pool=pool,
        )

    def run(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Copy `x` (rows × in) into the graph's input, compute, and return a copy of the (rows × out) result."""
        source = np.ascontiguousarray(x, dtype=np.float32)
        if source.shape[0] != self.rows:
            raise ValueError(f"this product takes {self.rows} rows, not {source.shape[0]}")
        ctypes.memmove(self._input, source.ctypes.data, source.nbytes)
        status = self.ggml.graph_compute(self._graph, ctypes.byref(self._plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned {status}")
        result = np.empty((self.rows, self.out_features), dtype=np.float32)
        ctypes.memmove(result.ctypes.data, self._output, result.nbytes)
        return result

    def close(self) -> None:
        self.ggml.threadpool_free(self._pool)
        self.ggml.free(self._context)
