"""ggml's graph operations beyond the matrix products (`ggml_library.py`), through ctypes: what a whole decoder step
needs to run as one ggml graph (`decode_graph.py`), as llama.cpp builds its own: norms, element-wise arithmetic,
views, rotary embeddings, softmax, row lookups. Signatures are those of ggml.h; this module never imports mlx.
"""

import ctypes
from collections.abc import Callable
from functools import cache
from typing import Any, Final

from exo.worker.engines.mlx.cpu.ggml_library import Ggml

ROPE_NEOX: Final = 2
"""`GGML_ROPE_TYPE_NEOX`: the rotary embedding that rotates a head's first half against its second (mlx's
`traditional=False`), as qwen2 and llama models in mlx-lm apply it."""
_TENSOR_DATA_OFFSET: Final = 248
"""Byte offset of `data` in `struct ggml_tensor` (ggml.h, 64-bit: type and padding, buffer, ne[4], nb[4], op,
op_params[16], flags, src[10], view_src, view_offs); checked against `ggml_get_data` when the ops are loaded."""


@cache
def graph_ops(ggml: Ggml) -> "GgmlGraphOps":
    """The process's one set of graph operations of a ggml build (bound, and its tensor layout checked, once)."""
    return GgmlGraphOps(ggml)


class GgmlGraphOps:
    """The graph operations of one ggml build (the libraries `ggml` loaded). Every op takes and returns tensor
    addresses as ints, as ggml's C functions do."""

    def __init__(self, ggml: Ggml) -> None:
        self.ggml = ggml
        base = ctypes.CDLL(str(ggml.library_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        p, i, w, f, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_size_t

        def bind(name: str, restype: object, *argtypes: object) -> Callable[..., Any]:
            function = getattr(base, name)
            function.restype, function.argtypes = restype, list(argtypes)
            return function

        self.new_tensor_1d = bind("ggml_new_tensor_1d", p, p, i, w)
        self.new_tensor_2d = bind("ggml_new_tensor_2d", p, p, i, w, w)
        self.new_tensor_3d = bind("ggml_new_tensor_3d", p, p, i, w, w, w)
        self.new_tensor_4d = bind("ggml_new_tensor_4d", p, p, i, w, w, w, w)
        self.rms_norm = bind("ggml_rms_norm", p, p, p, f)
        self.mul = bind("ggml_mul", p, p, p, p)
        self.add = bind("ggml_add", p, p, p, p)
        self.out_prod = bind("ggml_out_prod", p, p, p, p)
        self.reshape_2d = bind("ggml_reshape_2d", p, p, p, w, w)
        self.reshape_3d = bind("ggml_reshape_3d", p, p, p, w, w, w)
        self.reshape_4d = bind("ggml_reshape_4d", p, p, p, w, w, w, w)
        self.view_3d = bind("ggml_view_3d", p, p, p, w, w, w, s, s, s)
        self.view_4d = bind("ggml_view_4d", p, p, p, w, w, w, w, s, s, s, s)
        self.permute = bind("ggml_permute", p, p, p, i, i, i, i)
        self.cont = bind("ggml_cont", p, p, p)
        self.concat = bind("ggml_concat", p, p, p, p, i)
        self.transpose = bind("ggml_transpose", p, p, p)
        self.soft_max_ext = bind("ggml_soft_max_ext", p, p, p, p, f, f)
        self.flash_attn_ext = bind("ggml_flash_attn_ext", p, p, p, p, p, p, f, f, f)
        self.rope_ext = bind("ggml_rope_ext", p, p, p, p, p, i, i, i, f, f, f, f, f, f)
        self.get_rows = bind("ggml_get_rows", p, p, p, p)
        self.set_rows = bind("ggml_set_rows", p, p, p, p, p)
        self.is_contiguous = bind("ggml_is_contiguous", ctypes.c_bool, p)
        # (ctx, type, ne0..ne3, args, n_args, fun, n_tasks, userdata): a node computed by `fun` on the pool's threads.
        self.custom_4d = bind("ggml_custom_4d", p, p, i, w, w, w, w, ctypes.POINTER(p), i, p, i, p)
        self.new_graph_custom = bind("ggml_new_graph_custom", p, p, s, ctypes.c_bool)
        self.set_input = bind("ggml_set_input", None, p)
        self.set_output = bind("ggml_set_output", None, p)
        # ggml-alloc's graph allocator: a graph's intermediate tensors share one buffer, reused between nodes.
        self.cpu_buffer_type = bind("ggml_backend_cpu_buffer_type", p)
        self.gallocr_new = bind("ggml_gallocr_new", p, p)
        self.gallocr_alloc_graph = bind("ggml_gallocr_alloc_graph", ctypes.c_bool, p, p)
        self.gallocr_free = bind("ggml_gallocr_free", None, p)
        self.gallocr_get_buffer_size = bind("ggml_gallocr_get_buffer_size", s, p, i)
        # Those `Ggml` binds already: the same functions, not bound twice.
        self.new_context = ggml.new_context
        self.free = ggml.free
        self.mul_mat = ggml.mul_mat
        self.swiglu_split = ggml.swiglu_split
        self.get_data = ggml.get_data
        self.build_forward_expand = ggml.build_forward_expand
        self._check_data_offset()

    def set_data(self, tensor: int, address: int) -> None:
        """Point a tensor of a non-allocating context at `address` (memory that must outlive every use)."""
        ctypes.c_void_p.from_address(tensor + _TENSOR_DATA_OFFSET).value = address

    def _check_data_offset(self) -> None:
        context = self.new_context(1024 + int(self.ggml.tensor_overhead()))
        try:
            tensor = int(self.new_tensor_1d(context, 0, 4))
            stored = ctypes.c_void_p.from_address(tensor + _TENSOR_DATA_OFFSET).value
            if stored != self.get_data(tensor):
                raise RuntimeError("this ggml build's struct ggml_tensor does not keep `data` where exo expects it")
        finally:
            self.free(context)
