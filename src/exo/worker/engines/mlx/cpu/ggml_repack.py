"""ggml's CPU_REPACK buffer type through ctypes: weight matrices held interleaved for ggml's SIMD kernels, as
llama.cpp holds them (issue 33).

llama.cpp loads a Q4_0, Q4_K or IQ4_NL matrix (with AVX2 on x86; others on ARM) into this buffer type, whose
`set_tensor` rearranges the blocks of 8 rows into one interleaved block (`block_q4_Kx8`...), and ggml's graph compute
then multiplies such a matrix with kernels reading 8 rows at once (ggml-cpu's `repack.cpp`, dispatched by the
tensor's buffer). Measured on the 2-core AVX-512 EPYC, the 1.5B's Q4_K products of a decode step took 26.4 ms
repacked against 44.2 ms as stored (1.67×), 8 rows 1.54×; 512 rows (a prefill piece) 0.72×, as llama.cpp's own
prefill pays. The repacked bytes are no blocks a reader can index (an embedding lookup, a dequantization), so only a
layer's product matrices are held this way. Whether ggml repacks a matrix (its type and row count, for this CPU) is
ggml's choice, read from the tensor once the buffer type has initialized it (`tensor->extra`: its repack traits,
NULL for none), so nothing here restates ggml's rules.

Which layouts pay was measured per type on the 2-core AVX-512 EPYC (docs/PERFORMANCE.md section 12): a Q4_0 matrix's
repacked kernels were 1.4-1.8x faster than the stored layout's at every row count from 1 to 512, a Q4_K matrix's
1.45-1.69x faster up to 16 rows and 1.4x slower at 512. ggml offers no way back from a repacked layout (the buffer
type has no `get_tensor`), so `q4_k_from_8x8` reads a Q4_K matrix's interleaved blocks back into the blocks the file
stored, for the passes over many rows where the stored layout's kernels are the faster ones (`READ_BACK_ROWS`). Its
layout is ggml's `block_q4_Kx8` (ggml-cpu's `repack.cpp`, `make_block_q4_Kx8` with 8-byte interleaving, which ggml
picks with AVX2 on x86 and with int8 matrix multiply on ARM); a matrix is read back only where reading it back after
loading gave exactly the file's blocks (`GgmlMatrix.repacked_from_blocks`), so another layout (another CPU, another
ggml) is never misread.
"""

import ctypes
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

_EXTRA_BUFFER_TYPES: Final = b"ggml_backend_dev_get_extra_bufts"
_REPACK_NAME: Final = b"CPU_REPACK"
_MAX_NAME: Final = 64
"""GGML_MAX_NAME (ggml.h): `struct ggml_tensor`'s `extra` follows its `name`."""


RepackPolicy = Literal["none", "measured", "all"]
"""Which matrices a load holds repacked where ggml has a layout for them: none; those of a type measured to pay
(`REPACKED_THROUGHOUT`, and Q4_K where its layout reads back: `READ_BACKS`); all (the others' long passes then run
ggml's repacked kernels, as llama.cpp's do)."""

REPACKED_THROUGHOUT: Final = frozenset({"Q4_0"})
"""Types whose repacked kernels were measured faster at every row count (Q4_0: 1.4-1.8x from 1 to 512 rows), held
repacked with nothing read back."""

READ_BACK_ROWS: Final = 256
"""Passes over at least this many rows multiply a read-back matrix in the file's layout. Measured on the 2-core
AVX-512 EPYC, one layer of the 1.5B (its seven Q4_K matrices, 26 MB, read back in 8.7 ms): repacked against stored
products 11.1 against 10.0 ms at 32 rows, 46 against 37 at 128 (even once read back), 94 against 68 at 256, 198
against 131 at 512; 1.45-1.69x faster repacked from 1 to 16 rows (docs/PERFORMANCE.md section 12)."""

_Q4_K_BLOCK: Final = 144
"""`block_q4_K`: d and dmin (float16), 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit values."""
_ROWS: Final = 8
_LOW_SIX, _TOP_TWO, _LOW_FOUR = np.uint32(0x3F3F3F3F), np.uint32(0x03030303), np.uint32(0x0F0F0F0F)


def q4_k_from_8x8(repacked: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8]) -> None:
    """Q4_K blocks interleaved as ggml's `block_q4_Kx8` (`repacked`: the matrix's bytes, 8 rows' n-th blocks in one
    1,152-byte block) back into the stored rows `out` (rows × row bytes, C-contiguous).

    Each interleaved block holds the 8 rows' d values, then their dmin values, then 96 bytes of scales and mins (for
    each of the 8 sub-blocks, 12 bytes of the 8 rows' 6-bit scale and min: rows 0-3 whole in bytes 0-7 with rows
    4-7's top two bits above them, rows 4-7's low four bits in bytes 8-11), then the rows' 4-bit values 8 bytes of
    a row at a time. Done as whole-array moves over 16-, 32- and 64-bit words (0.27 ms a MB on the EPYC)."""
    rows, row_bytes = out.shape
    if rows % _ROWS or row_bytes % _Q4_K_BLOCK or repacked.size != out.size or not out.flags.c_contiguous:
        raise ValueError(f"{repacked.size} bytes are no block_q4_Kx8 matrix of {rows} rows of {row_bytes} bytes")
    groups, blocks = rows // _ROWS, row_bytes // _Q4_K_BLOCK
    source = np.ascontiguousarray(repacked).reshape(-1)
    # The values: 16 chunks of 8 rows' 8 bytes each, into each row's 16 chunks.
    stored64 = out.view(np.uint64).reshape(groups, _ROWS, blocks, 18)
    stored64[..., 2:] = (
        source.view(np.uint64)
        .reshape(groups, blocks, 144)[..., 16:]
        .reshape(groups, blocks, 16, _ROWS)
        .transpose(0, 3, 1, 2)
    )
    halves = source.view(np.uint16).reshape(groups, blocks, 576)
    stored16 = out.view(np.uint16).reshape(groups, _ROWS, blocks, 72)
    stored16[..., 0] = halves[..., 0:8].transpose(0, 2, 1)
    stored16[..., 1] = halves[..., 8:16].transpose(0, 2, 1)
    # Scales and mins: per sub-block, 3 words of 4 rows' bytes; unpacked to [scale|min, sub-block, rows 0-3|4-7].
    words = source.view(np.uint32).reshape(groups, blocks, 288)[..., 8:32].reshape(groups, blocks, 8, 3)
    first, second, low = words[..., 0], words[..., 1], words[..., 2]
    unpacked = np.empty((groups, blocks, 2, 8, 2), np.uint32)
    unpacked[:, :, 0, :, 0] = first & _LOW_SIX
    unpacked[:, :, 0, :, 1] = (low & _LOW_FOUR) | (((first >> 6) & _TOP_TWO) << 4)
    unpacked[:, :, 1, :, 0] = second & _LOW_SIX
    unpacked[:, :, 1, :, 1] = ((low >> 4) & _LOW_FOUR) | (((second >> 6) & _TOP_TWO) << 4)
    # Bytes [scale|min, sub-block, row] to [row, scale|min, sub-block]: a row's 8 scales, then its 8 mins.
    by_row = np.ascontiguousarray(unpacked.view(np.uint8).reshape(groups, blocks, 2, 8, _ROWS).transpose(0, 4, 1, 2, 3))
    row_words = by_row.view(np.uint32).reshape(groups, _ROWS, blocks, 2, 2)
    scales_low, scales_high = row_words[..., 0, 0], row_words[..., 0, 1]
    mins_low, mins_high = row_words[..., 1, 0], row_words[..., 1, 1]
    # Q4_K's 12 bytes (`get_scale_min_k4`): sub-blocks 0-3 with the top bits of 4-7 above, then 4-7's low bits.
    stored32 = out.view(np.uint32).reshape(groups, _ROWS, blocks, 36)
    stored32[..., 1] = scales_low | (((scales_high >> 4) & _TOP_TWO) << 6)
    stored32[..., 2] = mins_low | (((mins_high >> 4) & _TOP_TWO) << 6)
    stored32[..., 3] = (scales_high & _LOW_FOUR) | ((mins_high & _LOW_FOUR) << 4)


READ_BACKS: Final[dict[str, Callable[[npt.NDArray[np.uint8], npt.NDArray[np.uint8]], None]]] = {"Q4_K": q4_k_from_8x8}
"""The block types whose repacked layout can be read back, by ggml's type name."""


class GgmlRepack:
    """The CPU_REPACK buffer type of one ggml build and the calls that place a matrix in it."""

    def __init__(self, base: ctypes.CDLL, buffer_type: int) -> None:
        """`base`: the build's libggml-base, as `ggml_repack` opened it."""
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        self.buffer_type = buffer_type
        self._allocate = base.ggml_backend_alloc_ctx_tensors_from_buft
        self._allocate.restype, self._allocate.argtypes = pointer, [pointer, pointer]
        self._set = base.ggml_backend_tensor_set
        self._set.restype, self._set.argtypes = None, [pointer, pointer, size, size]
        self._free = base.ggml_backend_buffer_free
        self._free.restype, self._free.argtypes = None, [pointer]
        self._name = base.ggml_get_name
        self._name.restype, self._name.argtypes = pointer, [pointer]

    def allocate(self, context: int) -> int:
        """A buffer of this type holding every tensor of `context` (a context that allocates nothing), each
        initialized for its repacked layout; 0 where it could not be allocated."""
        return int(self._allocate(context, self.buffer_type) or 0)

    def chose_layout(self, tensor: int) -> bool:
        """Whether ggml chose a repacked layout for `tensor` (allocated by `allocate`): its `extra` is set."""
        name = int(self._name(tensor) or 0)
        return bool(ctypes.c_void_p.from_address(name + _MAX_NAME).value)

    def set(self, tensor: int, address: int, nbytes: int) -> None:
        """Fill `tensor` from the blocks at `address` as the file stores them: ggml interleaves them as it copies."""
        self._set(tensor, address, 0, nbytes)

    def free(self, buffer: int) -> None:
        self._free(buffer)


@cache
def ggml_repack(library_dir: Path) -> GgmlRepack | None:
    """The CPU_REPACK buffer type of the ggml build in `library_dir`, or None where its CPU backend offers none."""
    pointer = ctypes.c_void_p
    base = ctypes.CDLL(str(library_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(library_dir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    try:
        registry_of_cpu = cpu.ggml_backend_cpu_reg
        device_of = base.ggml_backend_reg_dev_get
        function_of = base.ggml_backend_reg_get_proc_address
        name_of = base.ggml_backend_buft_name
    except AttributeError:
        return None
    registry_of_cpu.restype, registry_of_cpu.argtypes = pointer, []
    device_of.restype, device_of.argtypes = pointer, [pointer, ctypes.c_size_t]
    function_of.restype, function_of.argtypes = pointer, [pointer, ctypes.c_char_p]
    name_of.restype, name_of.argtypes = ctypes.c_char_p, [pointer]
    registry = registry_of_cpu()
    address = function_of(registry, _EXTRA_BUFFER_TYPES) if registry else None
    if not address:
        return None
    extra_types = ctypes.CFUNCTYPE(ctypes.POINTER(pointer), pointer)(address)(device_of(registry, 0))
    index = 0
    while extra_types and extra_types[index]:
        buffer_type = int(extra_types[index] or 0)
        if name_of(buffer_type) == _REPACK_NAME:
            return GgmlRepack(base, buffer_type)
        index += 1
    return None
