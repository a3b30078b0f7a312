"""exo's products for Q8_0, Q5_0, Q6_K and repacked Q4_K matrices (`rows_kernel.cpp`), as nodes of a ggml graph.

For Q8_0, Q5_0 and Q6_K (the default model's GGUF: 450 of its 489 MB) ggml's x86 kernels cost almost as much per
row at 8 rows as at one, and its one-row products read a matrix from memory slower than it allows. For Q4_K (the
1.5B's GGUF: 757 of its 1,112 MB), held in ggml's interleaved `block_q4_Kx8` layout, ggml's kernels read the
matrix again for every four rows (and for each of one to three). For Q6_K (the rest of the 1.5B's GGUF) the file's
layout costs exo's products more in unpacking and transposing than in multiplying a few rows, so with AVX-512 a
layer's Q6_K matrices are packed at load into the kernel's own layout (`pack`: the same bytes, sixteen outputs'
values two or three instructions from the registers the products use), whose products take every row count
(`packed_product`; every graph reaches them through `GgmlMatrix.product_node`).
`rows_kernel.cpp` multiplies a weight block by many rows at once with AVX-512 VNNI (the outputs in a register's
lanes, any number of rows) or AVX-VNNI (up to 8 rows in the lanes). `exo ggml build` compiles it beside ggml's
libraries (`libexo-rows`); a graph uses it through `ggml_custom_4d` for products from the library's fewest rows for
the block type and row length (`RowsKernel.fewest_rows`: with AVX-512 one row for Q8_0, Q5_0 and repacked Q4_K, 2 or
3 for Q6_K) up to its most (`most_rows`: with AVX-512 any number for Q8_0, Q5_0 and repacked Q4_K, prefill pieces
included, and 128 for Q6_K; 8 with AVX-VNNI only), and ggml's `ggml_mul_mat` everywhere else: fewer or more rows,
other block types, other repacked matrices, Q4_K read back into its stored blocks.
`EXO_ROWS_KERNEL=off` turns it off (to compare).
"""

import ctypes
import hashlib
import os
import platform
import sys
from functools import cache
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.ggml_graph_ops import GgmlGraphOps, graph_ops
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES, Ggml
from exo.worker.engines.mlx.cpu.ggml_locate import GGML_BUILD_COMMAND

ROWS_SOURCE: Final = Path(__file__).with_name("rows_kernel.cpp")


def _library_name() -> str:
    try:
        digest = hashlib.sha256(ROWS_SOURCE.read_bytes()).hexdigest()[:12]
    except OSError:  # an install without the source: nothing of that name is ever built or found
        digest = "no-source"
    return f"libexo-rows-{digest}{'.dylib' if sys.platform == 'darwin' else '.so'}"


ROWS_LIBRARY: Final = _library_name()
"""Named by its source's digest: a build of older source is never loaded, and `exo ggml build` builds this one."""
ROWS_KERNEL_VARIABLE: Final = "EXO_ROWS_KERNEL"
BLOCK_VALUES: Final = {GGML_TYPES["Q8_0"]: 32, GGML_TYPES["Q5_0"]: 32, GGML_TYPES["Q6_K"]: 256, GGML_TYPES["Q4_K"]: 256}
"""The block types the kernel multiplies, and the values of a block (a row is whole blocks)."""
REPACKED_ONLY: Final = frozenset({GGML_TYPES["Q4_K"]})
"""The types it reads only as ggml's CPU_REPACK buffer holds them (Q4_K: `block_q4_Kx8`); the others only as stored."""
PACKED_TYPES: Final = frozenset({"Q6_K"})
"""The block types a matrix's blocks are packed into exo's own layout for, at load (`RowsKernel.pack`)."""
F32: Final = GGML_TYPES["F32"]
_ALL_THREADS: Final = -1  # GGML_N_TASKS_MAX: every thread of the pool computes a share


def rows_kernel_builds_here(machine: str | None = None) -> bool:
    """Whether `exo ggml build` compiles the kernel on this machine: x86-64 only (its instructions are x86's)."""
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


class RowsKernel:
    """The loaded library: `applies` says whether a product goes to it, `product` adds its node to a graph."""

    def __init__(self, library: Path) -> None:
        self._library = ctypes.CDLL(str(library))
        self._library.exo_rows_max.restype, self._library.exo_rows_max.argtypes = ctypes.c_int, []
        self._library.exo_rows_min.restype = ctypes.c_int
        self._library.exo_rows_min.argtypes = [ctypes.c_int, ctypes.c_int64]
        self._library.exo_rows_most.restype, self._library.exo_rows_most.argtypes = ctypes.c_int, [ctypes.c_int]
        self.max_rows = int(self._library.exo_rows_max())
        """The lanes of its registers: 16 with AVX-512 VNNI, 8 with AVX-VNNI only (0: no kernel for this CPU)."""
        self.most_rows = {kind: int(self._library.exo_rows_most(kind)) for kind in BLOCK_VALUES}
        """The most rows it takes a product of each block type for: with AVX-512 any number (a prefill piece's) for
        Q8_0, Q5_0 and repacked Q4_K, and 128 for Q6_K (beyond, ggml's tiled product is as fast), else `max_rows`."""
        self.function = int(ctypes.cast(self._library.exo_rows_mul_mat, ctypes.c_void_p).value or 0)
        """`exo_rows_mul_mat`'s address: a `ggml_custom_op_t` (dst, ith, nth, userdata)."""
        self.packed_function = int(ctypes.cast(self._library.exo_rows_mul_mat_packed_q6k, ctypes.c_void_p).value or 0)
        """`exo_rows_mul_mat_packed_q6k`'s: the products of a packed Q6_K matrix, any number of rows."""
        size, pointer = ctypes.c_int64, ctypes.c_void_p
        self._library.exo_q6k_packs.restype, self._library.exo_q6k_packs.argtypes = ctypes.c_int, [size, size]
        for name in ("exo_q6k_pack", "exo_q6k_unpack"):
            getattr(self._library, name).restype = ctypes.c_int
            getattr(self._library, name).argtypes = [pointer, pointer, size, size]
        self._fewest: dict[tuple[int, int], int] = {}

    def applies(self, weight_type: int, in_features: int, rows: int, *, repacked: bool = False) -> bool:
        """Whether a product of `rows` rows by a matrix of this type goes to the kernel: held `repacked` (in ggml's
        interleaved layout) or as stored, the layout the kernel reads for the type."""
        block = BLOCK_VALUES.get(weight_type)
        fewest, most = self.fewest_rows(weight_type, in_features), self.most_rows.get(weight_type, 0)
        layout_read = repacked == (weight_type in REPACKED_ONLY)
        return block is not None and layout_read and in_features % block == 0 and 0 < fewest <= rows <= most

    def fewest_rows(self, weight_type: int, in_features: int) -> int:
        """The fewest rows the library takes a product of this block type for, its rows of `in_features` values (0:
        not taken): where its products beat ggml's (with AVX-512 1 for Q8_0, Q5_0 and repacked Q4_K, and for Q6_K 2
        over rows of up to 2,048 values and 3 over longer ones; 5 for all but Q4_K with AVX-VNNI); fewer rows go to
        ggml."""
        key = (weight_type, in_features)
        if key not in self._fewest:  # asked for every product a graph builds: the library once a shape
            self._fewest[key] = int(self._library.exo_rows_min(weight_type, in_features))
        return self._fewest[key]

    def packs(self, type_name: str, out_features: int, in_features: int) -> bool:
        """Whether a matrix of this type and shape can be packed (`PackedLayout`): Q6_K with AVX-512 VNNI, whole
        groups of 16 outputs."""
        return type_name in PACKED_TYPES and bool(self._library.exo_q6k_packs(out_features, in_features))

    def pack(self, type_name: str, blocks: npt.NDArray[np.uint8], destination: int, in_features: int) -> None:
        """Q6_K `blocks` (out × row bytes, C-contiguous; rows of `in_features` values) packed into as many bytes at
        `destination`."""
        self._packing("exo_q6k_pack", type_name, blocks, (blocks.ctypes.data, destination), in_features)

    def unpack(self, type_name: str, packed: int, blocks: npt.NDArray[np.uint8], in_features: int) -> None:
        """The packed matrix at `packed` back into its blocks as stored, `blocks` (as `pack` takes them)."""
        self._packing("exo_q6k_unpack", type_name, blocks, (packed, blocks.ctypes.data), in_features)

    def _packing(
        self, name: str, type_name: str, blocks: npt.NDArray[np.uint8], addresses: tuple[int, int], in_features: int
    ) -> None:
        """`name` (the library's pack or unpack) from and to `addresses` (source, destination); it refuses a type or
        shape `packs` does not take."""
        out_features = blocks.shape[0]
        if type_name not in PACKED_TYPES or not blocks.flags.c_contiguous:
            raise ValueError(f"{type_name} blocks of shape {blocks.shape} are not packed here")
        if getattr(self._library, name)(*addresses, out_features, in_features) != 0:
            raise ValueError(f"{name} refused {out_features} × {in_features} {type_name}")

    def packed_product(self, ggml: Ggml, context: int, weight: int, x: int, *, out_features: int, rows: int) -> int:
        """A packed Q6_K `weight` times x: as `product`, any number of rows."""
        return self._node(graph_ops(ggml), context, (weight, x), (out_features, rows), self.packed_function)

    def product(self, ops: GgmlGraphOps, context: int, weight: int, x: int, *, out_features: int, rows: int) -> int:
        """weight (in × out, of a type in `BLOCK_VALUES`) times x (in × rows, float32): a float32 tensor (out ×
        rows), as `ggml_mul_mat(context, weight, x)` returns it; x is made contiguous first where it is not."""
        return self._node(ops, context, (weight, x), (out_features, rows), self.function)

    def _node(
        self, ops: GgmlGraphOps, context: int, operands: tuple[int, int], shape: tuple[int, int], function: int
    ) -> int:
        """`function`'s node: operands (weight, x), the result's shape (out, rows)."""
        weight, x = operands
        out_features, rows = shape
        if not ops.is_contiguous(x):
            x = ops.cont(context, x)
        args = (ctypes.c_void_p * 2)(weight, x)
        node = ops.custom_4d(context, F32, out_features, rows, 1, 1, args, 2, function, _ALL_THREADS, None)
        if not node:
            raise MemoryError("ggml could not add a multi-row product to the graph")
        return int(node)


def _turned_off() -> bool:
    return os.environ.get(ROWS_KERNEL_VARIABLE, "").lower() in ("off", "0", "false", "no")


def rows_kernel(library_dir: Path) -> RowsKernel | None:
    """The kernel built beside the ggml libraries in `library_dir`, or None: turned off (`EXO_ROWS_KERNEL=off`),
    not built there (another ggml build), or without the instructions it needs on this CPU."""
    return None if _turned_off() else _loaded(library_dir)


def rows_kernel_missing_reason(library_dir: Path) -> str | None:
    """Why `rows_kernel(library_dir)` is None, in words for the runner's report; None where it is not."""
    if rows_kernel(library_dir) is not None:
        return None
    if _turned_off():
        return f"{ROWS_KERNEL_VARIABLE}=off"
    if not rows_kernel_builds_here():
        return "x86-64 only"
    if not (library_dir / ROWS_LIBRARY).is_file():
        return f"not built beside this ggml ({GGML_BUILD_COMMAND} builds it)"
    return "this CPU has neither AVX-512 VNNI nor AVX-VNNI"


@cache
def _loaded(library_dir: Path) -> RowsKernel | None:
    library = library_dir / ROWS_LIBRARY
    if not library.is_file():
        return None
    kernel = RowsKernel(library)
    return kernel if kernel.max_rows > 0 else None
