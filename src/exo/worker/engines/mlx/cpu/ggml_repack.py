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
"""

import ctypes
from functools import cache
from pathlib import Path
from typing import Final

_EXTRA_BUFFER_TYPES: Final = b"ggml_backend_dev_get_extra_bufts"
_REPACK_NAME: Final = b"CPU_REPACK"
_MAX_NAME: Final = 64
"""GGML_MAX_NAME (ggml.h): `struct ggml_tensor`'s `extra` follows its `name`."""


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
