"""A decode step (one new token for each of one or more sequences) of a whole qwen2/llama model as one ggml graph
(issue 33), as llama.cpp computes a step.

With ggml's products inside mlx-lm's model a one-token step hands the activations between mlx and ggml 73 times
(the default model: q/k/v, o_proj and the MLP of 24 layers, and the logits), each behind an `mx.eval` of mlx's
small operations in between (norms, rope, attention); measured on a quiet 2-core EPYC the products took 16-18 ms of
a 31-35 ms step, and llama-server's whole step on the same file 18 ms (docs/PERFORMANCE.md). Here the embedding
lookup, every layer (norms, q/k/v with their biases, rope, attention, o_proj, the residual adds, the SwiGLU MLP),
the final norm and the logits are one graph over the model's own ggml matrices: one compute call a step, the
products over all the sequences' rows at once, attention per sequence (over views of the cache: ggml's flash
attention, which `layer_graph.py` uses for passes over several tokens, needs the new key joined to the cached ones,
a copy of the whole cache every step, measured slower from a few thousand cached tokens on).

The KV cache stays mlx-lm's (`KVCache` for one sequence, `BatchKVCache` for a batch), so everything built on it
(the prefix caches and their snapshots, trimming a discarded step, a batch's joins and filters) sees what mlx-lm's
own step leaves: the graph reads each layer's cached keys and values where mlx holds them, attends to them and to
the step's new key and value (the scores of both under one softmax, the weighted values summed), and the new keys and
values are appended as mlx-lm's attention appends them. For one sequence whose cache owns its buffers
(`owned_kv_cache.py`: nothing else has used them since a step appended through mlx) the graph writes them into the
buffers itself (`ggml_set_rows`, as llama.cpp writes its cache); otherwise, and for a batch, they are appended
through mlx (the slice assignment `update_and_fetch` makes, which mlx does in place where nothing else holds the
buffer, and as a copy where something does). `layer_graph.py` runs the same layers over several tokens a sequence
(prefill, verification).

A step's graph is kept and run again for the next steps, as llama.cpp reuses its graphs: building one through
ctypes cost about 2 ms of the default model's 24 ms step on a 2-core EPYC. Only its inputs change from step to
step (token ids, positions, each sequence's mask, the rows an in-place step writes); its views of the cache reach
past what is held to the next multiple of SPAN_STEP positions, the positions not yet held masked out, and mlx keeps a
cache's buffer in place from step to step (a slice update donates it) until it grows it, so a graph is built again
every SPAN_STEP steps, when the buffers move, or when the batch changes. A few graphs are kept (`KEPT_STEPS`): one
sequence verifying drafts alternates one-token steps with passes of a few tokens.
"""

import ctypes
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, cast

import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx import nn
from mlx_lm.models.cache import BatchKVCache, KVCache

from exo.worker.engines.mlx.cache.owned_kv_cache import (
    OwnedKVCache,
    adopt,
    append_through_mlx,
    buffers_of,
    has_room,
    is_plain_kv_cache,
    settle,
    state,
)
from exo.worker.engines.mlx.cpu.embedding_rows import EmbeddingRows
from exo.worker.engines.mlx.cpu.ggml_graph_ops import ROPE_NEOX, GgmlGraphOps, graph_ops
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES, ComputePlan, Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.gguf_layers import FileEmbedding
from exo.worker.engines.mlx.cpu.q8_layers import GGML_POLL, Q8Embedding, Q8Linear, Q8Weights, SwiGluMlp
from exo.worker.engines.mlx.cpu.rows_kernel import rows_kernel
from exo.worker.engines.mlx.cpu.stored_layout import StoredLayout
from exo.worker.engines.mlx.discarded_logits import logits_are_discarded
from exo.worker.engines.mlx.mixed_classes import mix_in
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

ARCHITECTURES: Final = frozenset({"qwen2", "llama"})
"""mlx-lm model types whose decoder layer is exactly the one built here (read in their source): pre-norm RMSNorm,
attention with optional q/k/v biases and NeoX-style rope, a SwiGLU MLP, residual adds."""
MAX_SEQUENCES: Final = 64
"""Batches up to this size run as the graph (its nodes grow with the sequences: attention is per sequence)."""
MAX_PASS_TOKENS: Final = 16
"""One sequence's pass over up to this many tokens (a draft's verification) runs as the graph too; longer ones (a
prefill piece) run a layer at a time (`layer_graph.py`), pausing between layers."""
_F32: Final = GGML_TYPES["F32"]
I32: Final = 26
"""`GGML_TYPE_I32` (ggml.h): token ids and positions."""
_I64: Final = 27
"""`GGML_TYPE_I64`: the cache rows a step writes its keys and values into (`ggml_set_rows`)."""
SPAN_STEP: Final = 32
"""A step graph is kept and run again while its sequences stay in the same buffers: its views of the cache reach
the next multiple of this many positions (those not yet held masked out), so one is built every this many steps
(building one from Python costs about 2 ms, a tenth of the default model's step) and attention reads at most this
many masked positions more."""
KEPT_STEPS: Final = 3
"""Step graphs kept at once (`_Steps`): one-row steps and a draft's verification passes of a few rows."""
_LAYER_NODES: Final = 40
"""Graph nodes a layer makes besides attention (about 30), and attention's per sequence (about 12) is added."""


_Cached = tuple[tuple[int, npt.NDArray[np.float32]], tuple[int, npt.NDArray[np.float32]]]
"""One layer's cached keys and values: a flat ggml tensor over each buffer's memory, and the buffer (numpy)."""


@dataclass(frozen=True)
class _Layer:
    input_norm: int
    post_norm: int
    q: GgmlMatrix
    k: GgmlMatrix
    v: GgmlMatrix
    q_bias: int | None
    k_bias: int | None
    v_bias: int | None
    o: GgmlMatrix
    gate: GgmlMatrix
    up: GgmlMatrix
    down: GgmlMatrix

    @property
    def matrices(self) -> tuple[GgmlMatrix, ...]:
        return (self.q, self.k, self.v, self.o, self.gate, self.up, self.down)


@dataclass(frozen=True)
class Shape:
    """What the graph needs of the model's configuration."""

    heads: int
    kv_heads: int
    head_dim: int
    norm_eps: float
    rope_base: float
    scale: float

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Sequences:
    """Where each sequence of a step stands in its layers' caches (the same in every layer)."""

    starts: tuple[int, ...]
    """Each sequence's first cached position in the cache's buffer (a batch's left padding)."""
    held: tuple[int, ...]
    """How many positions each sequence has cached: its new token's position (rope) too."""

    @classmethod
    def of(cls, caches: Sequence[KVCache] | Sequence[BatchKVCache]) -> "Sequences":
        first = caches[0]
        if isinstance(first, KVCache):
            return cls(starts=(0,), held=(first.offset,))
        end = cast(int, first._idx)  # pyright: ignore[reportPrivateUsage]
        padding = cast(list[int], first.left_padding.tolist())
        return cls(starts=tuple(padding), held=tuple(end - start for start in padding))

    @property
    def end(self) -> int:
        """Where every sequence's cached positions end in the buffers (a batch's left padding lines them up)."""
        return self.starts[0] + self.held[0]


class DecodeGraph:
    """A model's decode step as one ggml graph; `logits` runs it. Built by `decode_graph_for`, which checks the
    model is one this graph computes exactly."""

    def __init__(
        self,
        ops: GgmlGraphOps,
        *,
        shape: Shape,
        layers: Sequence[_Layer],
        embedding: EmbeddingRows,
        norm: int,
        head: Q8Weights,
        parameters: int,
    ) -> None:
        self._ops = ops
        self._shape = shape
        self._layers = tuple(layers)
        self._embedding = embedding
        self._norm = norm
        self._head = head.matrix
        self._threads = head
        self._parameters = parameters
        """The context holding the norms' weights and the biases in float32 (freed with this object)."""
        self._passes = _PassAllocator(ops)
        """Where a layer pass over many rows places its intermediate tensors (released when the runner is idle)."""
        self._work: ctypes.Array[ctypes.c_char] | None = None
        self._steps = _Steps(ops)
        """The step graphs kept for the next steps, each with an allocator of its own (a layer pass between two steps
        places its tensors in `_passes` without moving theirs)."""
        self._stored = StoredLayout()
        """The buffer a pass over many rows reads its layer's repacked matrices back into (`layer`'s `stored_in`)."""
        self._written: _Written | None = None
        """What the last in-place step left, for `resume`."""
        self._rows = rows_kernel(ops.ggml.library_dir)
        """exo's own products, where built beside this ggml (`rows_kernel.py`): Q8_0/Q5_0/Q6_K and repacked Q4_K
        products of the row counts it takes (with AVX-512 a step's, a batch's and a prefill piece's)."""
        self._finalizer = weakref.finalize(self, _free, self._ops, parameters, self._passes, self._steps)
        _LIVE.add(self)

    @property
    def layers(self) -> int:
        return len(self._layers)

    @property
    def read_back_bytes(self) -> int:
        """Bytes of the buffer passes over many rows read repacked matrices back into (0 until one has)."""
        return self._stored.nbytes

    @property
    def kept_steps(self) -> int:
        """How many step graphs are kept for the next steps."""
        return len(self._steps)

    @property
    def pass_buffer_bytes(self) -> int:
        """Bytes of the buffer layer passes place their tensors in (0 before a pass, and after a release)."""
        return self._passes.nbytes

    def close(self) -> None:
        """Free the parameters' context and the allocators' buffers now (else when this object is collected)."""
        self._finalizer()

    def logits(
        self, tokens: Sequence[int], caches: Sequence[KVCache] | Sequence[BatchKVCache], *, rows: int = 1
    ) -> mx.array | None:
        """The logits (sequences × rows × vocabulary) of feeding each sequence its `rows` tokens (`tokens`, sequence
        by sequence) after what `caches` hold (every layer's cache, evaluated, float32: one sequence's KVCache or a
        batch's BatchKVCache; several rows for one sequence only, each row seeing the rows before it); the step's
        keys and values are appended to them (lazily). None, with nothing done, where a cache's memory is not laid
        out as mlx-lm's steps leave it (each position's values side by side)."""
        self._written = None
        shape = self._shape
        sequences = Sequences.of(caches)
        batch = len(tokens) // rows
        if rows > 1 and batch != 1:
            raise ValueError("several rows a step are for one sequence")
        if min(sequences.held) <= 0:
            return None
        singles = [adopt(cache) for cache in caches if is_plain_kv_cache(cache)]
        views = [_arrays(cache) for cache in caches]
        in_place = len(singles) == len(caches) and all(
            state(cache) == "owned" and _writable(pair, sequences.end + rows)
            for cache, pair in zip(singles, views, strict=True)
        )
        key = _StepKey.of(views, sequences, rows, in_place=in_place)
        step = self._steps.find(key, sequences)
        if step is None:
            # A kept graph was built for buffers that fit (`_fits`); a step it serves has the same ones.
            if not all(self._fits(array, sequences, batch) for pair in views for array in pair):
                return None
            step = self._steps.keep(self._build_step(views, sequences, key))
        logits = self._run(step, tokens, sequences, batch=batch)
        if in_place:  # the graph wrote the step's keys and values into the buffers
            for cache in singles:
                cache.offset += rows
            self._written = _Written(singles, key.buffers, end=sequences.end + rows)
            return logits
        count, ops = len(tokens), self._ops
        kv = [
            (
                for_cache(_floats_at(ops.get_data(k), count * shape.kv_width), shape, batch, rows),
                for_cache(_floats_at(ops.get_data(v), count * shape.kv_width), shape, batch, rows),
            )
            for k, v in step.appended
        ]
        del views
        for cache, (k, v) in zip(caches, kv, strict=True):
            _append(cache, k, v, rows)
        return logits

    def resume(self, inputs: mx.array, caches: object) -> mx.array | None:
        """`logits` for one sequence's step over the caches the last in-place step wrote, none of them used since
        (`_Written.untouched`): its graph, or one kept for as many rows over the same buffers, runs again without
        reading the caches anew. None, with nothing done, otherwise (or where no kept graph serves the step)."""
        written, rows = self._written, inputs.shape[1]
        if written is None or (owned := written.untouched(caches, rows)) is None:
            return None
        sequences = Sequences(starts=(0,), held=(written.end,))
        step = self._steps.find(_StepKey(rows=rows, starts=(0,), buffers=written.buffers, in_place=True), sequences)
        if step is None:
            return None
        logits = self._run(step, _token_ids(inputs), sequences, batch=1)
        for cache in owned:
            cache.offset += rows
        written.end += rows
        return logits

    def _run(self, step: "_StepGraph", tokens: Sequence[int], sequences: Sequences, *, batch: int) -> mx.array:
        """Run `step` for `tokens`: its logits (batch × rows × vocabulary)."""
        step.write(tokens, sequences, self._embedding)
        # The step's forward pass, computed here and now by ggml's threads: the model's work, which the host-overhead
        # meter counts as the device's (the caller's part, such as the graph being built, is host work around it).
        with STEP_CLOCK.part("device"):
            self.compute(step.graph, step.plans)
        count, vocabulary = len(tokens), self._head.shape[0]
        # Copied out (mx.array copies) before the graph runs again.
        values = _floats_at(self._ops.get_data(step.logits), count * vocabulary)
        return mx.array(values.reshape(batch, count // batch, vocabulary))

    def _build_step(
        self,
        views: Sequence[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]],
        sequences: Sequences,
        key: "_StepKey",
    ) -> "_StepGraph":
        """The step graph for `key` (its sequences' buffers and places), its views of the cache reaching `end`."""
        ops, shape = self._ops, self._shape
        rows, batch = key.rows, len(sequences.starts)
        count = batch * rows
        end = _span_end(sequences, capacity=min(array.shape[2] for pair in views for array in pair))
        group, first = shape.heads // shape.kv_heads, min(sequences.starts)
        if key.batched:  # one mask over the positions from the earliest start, a sequence's padding hidden
            spans = [end - first]
            masks = [np.zeros((batch, 1, group, spans[0] + 1), dtype=np.float32)]
        else:
            spans = [end - start for start in sequences.starts]
            masks = [_new_rows_mask(span, rows, group) for span in spans]
        nodes = len(self._layers) * (_LAYER_NODES + 16 * batch + 4) + 64
        # The tensors' and graph's descriptions only: their data is the allocator's, or mlx's (the caches).
        overhead = nodes * int(ops.ggml.tensor_overhead()) + 2 * int(ops.ggml.graph_overhead())
        context = ops.new_context(overhead, allocates=False)
        outside = ops.new_context(int(ops.ggml.tensor_overhead()) * (4 * len(views) + batch + 4), allocates=False)
        allocator = self._steps.new_allocator()
        try:
            ids = ops.new_tensor_1d(context, I32, count)
            positions = ops.new_tensor_1d(context, I32, count)
            # The step's own rows of the embedding table, written with its tokens: a table read from the file is
            # never in memory whole, and a held one is read the same way.
            embedded = ops.new_tensor_2d(
                context, GGML_TYPES[self._embedding.type_name], self._embedding.shape[1], count
            )
            for tensor in (ids, positions, embedded):
                ops.set_input(tensor)
            mask_tensors: list[int] = []
            for mask in masks:
                mask_tensors.append(ops.new_tensor_4d(outside, _F32, *reversed(mask.shape)))
                ops.set_data(mask_tensors[-1], mask.ctypes.data)
            x = ops.get_rows(context, embedded, ids)
            appended: list[tuple[int, int]] = []
            for index, (keys, values) in enumerate(views):
                cached = (_flat(ops, outside, keys), keys), (_flat(ops, outside, values), values)

                def attend(q: int, k: int, v: int, cached: _Cached = cached) -> int:
                    if key.batched:
                        return self._batch_attention(
                            context, q=q, k=k, v=v, cached=cached, first=first, span=spans[0], mask=mask_tensors[0]
                        )
                    return self._step_attention(
                        context,
                        q=q,
                        k=k,
                        v=v,
                        cached=cached,
                        starts=sequences.starts,
                        spans=spans,
                        rows=rows,
                        masks=mask_tensors,
                    )

                x, new_keys, new_values = self.layer(
                    context, index, x, tokens=count, positions=positions, attend=attend
                )
                appended.append((new_keys, new_values))
            x = ops.mul(context, ops.rms_norm(context, x, shape.norm_eps), self._norm)
            logits = self._product(context, self._head, self._head.tensor, x, count)
            rows_tensor, written = None, list[int]()
            if key.in_place:
                rows_tensor = ops.new_tensor_1d(context, _I64, shape.kv_heads * count)
                ops.set_input(rows_tensor)
                for (keys, values), new in zip(views, appended, strict=True):
                    written += [
                        _write_rows(
                            ops, context, outside, array=array, new=tensor, rows=rows_tensor, shape=shape, count=count
                        )
                        for array, tensor in zip((keys, values), new, strict=True)
                    ]
            graph = ops.new_graph_custom(context, nodes, False)
            for output in (logits, *[tensor for pair in appended for tensor in pair], *written):
                ops.set_output(output)
                ops.build_forward_expand(graph, output)
            if not ops.gallocr_alloc_graph(allocator, graph):
                raise MemoryError("ggml could not allocate a decode step's tensors")
        except BaseException:
            ops.free(outside)
            ops.free(context)
            ops.gallocr_free(allocator)
            raise
        return _StepGraph(
            key=key,
            end=end,
            contexts=(context, outside),
            graph=graph,
            ids=ops.get_data(ids),
            positions=ops.get_data(positions),
            embedded=ops.get_data(embedded),
            masks=masks,
            logits=logits,
            appended=appended,
            cache_rows=0 if rows_tensor is None else ops.get_data(rows_tensor),
            allocator=allocator,
        )

    def _fits(self, array: npt.NDArray[np.float32], sequences: Sequences, count: int) -> bool:
        shape = self._shape
        return (
            array.dtype == np.float32
            and array.shape[:2] == (count, shape.kv_heads)
            and array.shape[2] >= sequences.end
            and array.shape[3] == shape.head_dim
            and array.strides[3] == 4
            and min(array.strides[:3]) >= 4 * shape.head_dim
        )

    def layer(
        self,
        context: int,
        index: int,
        x: int,
        *,
        tokens: int,
        positions: int,
        attend: Callable[[int, int, int], int],
        stored_in: int | None = None,
    ) -> tuple[int, int, int]:
        """Decoder layer `index` on the hidden states `x` (hidden × `tokens`, `positions` theirs): the layer's output,
        and the tokens' keys (after rope; head dim × kv heads × tokens) and values (kv heads · head dim × tokens)
        for the caches. `attend(q, k, v)` is the attention over them (q after rope: head dim × heads × tokens),
        returning heads · head dim × tokens. `stored_in`: a context (allocating nothing) for tensors over the
        layer's repacked matrices read back into their stored layout (`stored_layout.py`), whose products over
        many rows are the faster; None multiplies the matrices as held."""
        ops, shape = self._ops, self._shape
        layer = self._layers[index]
        read_back = {} if stored_in is None else self._stored.tensors(ops, stored_in, layer.matrices)

        def weight(matrix: GgmlMatrix) -> int:
            return read_back.get(id(matrix), matrix.tensor)

        count = tokens

        def product(matrix: GgmlMatrix, source: int) -> int:
            return self._product(context, matrix, weight(matrix), source, count)

        h = ops.mul(context, ops.rms_norm(context, x, shape.norm_eps), layer.input_norm)
        q = _biased(ops, context, product(layer.q, h), layer.q_bias)
        k = _biased(ops, context, product(layer.k, h), layer.k_bias)
        v = _biased(ops, context, product(layer.v, h), layer.v_bias)
        q = self._rope(context, ops.reshape_3d(context, q, shape.head_dim, shape.heads, count), positions)
        k = self._rope(context, ops.reshape_3d(context, k, shape.head_dim, shape.kv_heads, count), positions)
        x = ops.add(context, x, product(layer.o, attend(q, k, v)))
        h = ops.mul(context, ops.rms_norm(context, x, shape.norm_eps), layer.post_norm)
        gated = ops.swiglu_split(context, product(layer.gate, h), product(layer.up, h))
        x = ops.add(context, x, product(layer.down, gated))
        return x, k, v

    def _product(self, context: int, matrix: GgmlMatrix, weight: int, x: int, rows: int) -> int:
        """`weight` (the matrix's tensor, or its read-back) times x's `rows` rows: a packed matrix's own product;
        exo's product where it applies (a Q8_0, Q5_0 or Q6_K matrix as stored, a repacked Q4_K one, a row count the
        kernel takes), else ggml's."""
        if matrix.packed_by is not None:
            return matrix.product_node(context, x, rows)
        kernel = self._rows
        repacked = matrix.repacked and weight == matrix.tensor  # a read-back holds the blocks as stored
        if kernel is not None and kernel.applies(matrix.type, matrix.shape[1], rows, repacked=repacked):
            return kernel.product(self._ops, context, weight, x, out_features=matrix.shape[0], rows=rows)
        return self._ops.mul_mat(context, weight, x)

    def _step_attention(
        self,
        context: int,
        *,
        q: int,
        k: int,
        v: int,
        cached: _Cached,
        starts: Sequence[int],
        spans: Sequence[int],
        rows: int,
        masks: Sequence[int],
    ) -> int:
        """A step's attention: each sequence's own (its rows' queries against its cached and new keys), side by
        side (heads · head dim × tokens)."""
        attended: int | None = None
        for index, (start, span, mask) in enumerate(zip(starts, spans, masks, strict=True)):
            one = self._attention(
                context, q=q, k=k, v=v, cached=cached, index=index, start=start, span=span, rows=rows, mask=mask
            )
            attended = one if attended is None else self._ops.concat(context, attended, one, 1)
        assert attended is not None
        return attended

    def _batch_attention(
        self, context: int, *, q: int, k: int, v: int, cached: _Cached, first: int, span: int, mask: int
    ) -> int:
        """A batch's one-token step attention as one set of nodes for every sequence, as `_attention` computes one
        sequence's (the sequences along ggml's fourth dimension, where one sequence's rows go): each sequence's
        query against the `span` cached positions from `first` (the earliest start; `mask`, [span + 1, group, 1,
        batch], hides a sequence's padding and what is not held) and its new key; one softmax; the weighted values.
        With a node a sequence, a batch of 8 cost ggml's pool a synchronisation for each of some 2,000 small nodes a
        step."""
        ops, shape = self._ops, self._shape
        heads, kv_heads, head_dim = shape.heads, shape.kv_heads, shape.head_dim
        group, width = heads // kv_heads, 4 * head_dim
        (keys, keys_array), (values, values_array) = cached
        batch = keys_array.shape[0]
        queries = ops.view_4d(
            context, q, head_dim, group, kv_heads, batch, width, group * width, heads * width, 0
        )  # head dim × group × kv heads × sequences
        new_keys = ops.view_4d(
            context, k, head_dim, 1, kv_heads, batch, width, width, kv_heads * width, 0
        )  # head dim × 1 × kv heads × sequences
        new_values = ops.view_4d(context, v, 1, head_dim, kv_heads, batch, 4, width, kv_heads * width, 0)
        cached_keys = _batch_cached(ops, context, keys, keys_array, first=first, count=span)
        cached_values = _batch_cached(ops, context, values, values_array, first=first, count=span)
        scores = ops.concat(
            context, ops.mul_mat(context, cached_keys, queries), ops.mul_mat(context, new_keys, queries), 0
        )  # span + 1 × group × kv heads × sequences
        weights = ops.soft_max_ext(context, scores, mask, shape.scale, 0.0)
        row = 4 * (span + 1)
        weights_cached = ops.transpose(
            context, ops.view_4d(context, weights, span, group, kv_heads, batch, row, group * row, heads * row, 0)
        )
        weights_new = ops.view_4d(context, weights, 1, group, kv_heads, batch, row, group * row, heads * row, 4 * span)
        attended = ops.add(
            context,
            ops.out_prod(context, cached_values, weights_cached),
            ops.mul_mat(context, new_values, weights_new),
        )  # head dim × group × kv heads × sequences
        return ops.reshape_2d(context, attended, head_dim * heads, batch)

    def _attention(
        self,
        context: int,
        *,
        q: int,
        k: int,
        v: int,
        cached: _Cached,
        index: int,
        start: int,
        span: int,
        rows: int,
        mask: int,
    ) -> int:
        """Sequence `index`'s attention output (heads · head dim × rows): each kv head's group of query heads (query
        head h reads kv head h // (heads / kv heads), as mlx's grouped attention) against its `span` cached
        positions from `start`, read once for the group where mlx holds them, and its new keys (`mask`, [span +
        rows, group, 1, rows]: the positions held, and each row sees the new rows up to its own); one softmax over
        both; then each part's weighted values."""
        ops, shape = self._ops, self._shape
        heads, kv_heads, head_dim = shape.heads, shape.kv_heads, shape.head_dim
        group, width = heads // kv_heads, 4 * head_dim
        first = index * rows  # the sequence's first token among the step's
        queries = ops.view_4d(
            context, q, head_dim, group, kv_heads, rows, width, group * width, heads * width, first * heads * width
        )  # head dim × group × kv heads × rows
        new_keys = ops.view_3d(
            context, k, head_dim, rows, kv_heads, kv_heads * width, width, first * kv_heads * width
        )  # head dim × rows × kv heads
        if rows == 1:
            new_values = ops.view_3d(context, v, 1, head_dim, kv_heads, 4, width, index * kv_heads * width)
        else:  # rows × head dim × kv heads (one sequence: the whole of v)
            values = ops.reshape_3d(context, v, head_dim, kv_heads, rows)
            new_values = ops.cont(context, ops.permute(context, values, 1, 2, 0, 3))
        (keys, keys_array), (values_whole, values_array) = cached
        cached_keys = _cached(ops, context, keys, keys_array, index=index, start=start, count=span)
        cached_values = _cached(ops, context, values_whole, values_array, index=index, start=start, count=span)
        scores = ops.concat(
            context, ops.mul_mat(context, cached_keys, queries), ops.mul_mat(context, new_keys, queries), 0
        )  # positions + rows × group × kv heads × rows
        weights = ops.soft_max_ext(context, scores, mask, shape.scale, 0.0)
        row = 4 * (span + rows)
        weights_cached = ops.transpose(
            context, ops.view_4d(context, weights, span, group, kv_heads, rows, row, group * row, heads * row, 0)
        )
        weights_new = ops.view_4d(
            context, weights, rows, group, kv_heads, rows, row, group * row, heads * row, 4 * span
        )
        attended = ops.add(
            context,
            ops.out_prod(context, cached_values, weights_cached),
            ops.mul_mat(context, new_values, weights_new),
        )  # head dim × group × kv heads × rows: each row's heads in order
        return ops.reshape_2d(context, attended, head_dim * heads, rows)

    def attention(
        self,
        context: int,
        *,
        q: int,
        k: int,
        v: int,
        cached: tuple[int, int] | None,
        mask: int | None,
        batch: int,
        tokens: int,
    ) -> int:
        """softmax(q·kᵀ·scale + mask)·v over the cached positions and the new ones (heads · head dim × tokens ·
        batch), as ggml's flash attention (llama-server's on a CPU): the keys and values [head dim, context, kv
        heads, batch] joined once (`cached`: views of mlx's buffers, `cache_view`), query head h reading kv head
        h // group (ggml's broadcast, as mlx's grouped attention); the scores are never written out whole. `mask`:
        float16, 0 or -inf, [context, tokens, 1, batch or 1]; None where every query sees every key."""
        ops, shape = self._ops, self._shape
        head_dim, heads, kv_heads = shape.head_dim, shape.heads, shape.kv_heads
        new_keys = ops.permute(context, ops.reshape_4d(context, k, head_dim, kv_heads, tokens, batch), 0, 2, 1, 3)
        new_values = ops.permute(context, ops.reshape_4d(context, v, head_dim, kv_heads, tokens, batch), 0, 2, 1, 3)
        if cached is None:
            all_keys, all_values = new_keys, new_values
        else:
            cached_keys, cached_values = cached
            all_keys = ops.concat(context, cached_keys, new_keys, 1)
            all_values = ops.concat(context, cached_values, new_values, 1)
        queries = ops.permute(context, ops.reshape_4d(context, q, head_dim, heads, tokens, batch), 0, 2, 1, 3)
        attended = ops.flash_attn_ext(context, queries, all_keys, all_values, mask, shape.scale, 0.0, 0.0)
        return ops.reshape_2d(context, attended, head_dim * heads, tokens * batch)  # head dim × heads × tokens × batch

    def _rope(self, context: int, heads: int, positions: int) -> int:
        shape = self._shape
        return self._ops.rope_ext(
            context, heads, positions, None, shape.head_dim, ROPE_NEOX, 0, shape.rope_base, 1.0, 0.0, 1.0, 0.0, 0.0
        )

    @property
    def ops(self) -> GgmlGraphOps:
        return self._ops

    @property
    def shape(self) -> Shape:
        return self._shape

    def allocate(self, graph: int) -> None:
        """Place a layer pass's `graph`'s intermediate tensors in the passes' buffer (grown where it needs more)."""
        self._passes.allocate(graph)

    def _release_buffers(self) -> None:
        self._written = None
        self._steps.close()
        self._passes.release()
        self._stored.release()

    def compute(self, graph: int, plans: dict[int, ComputePlan] | None = None) -> None:
        """Run an allocated graph on the model's ggml thread pool; `plans` keeps its plan for each thread count
        (a kept step graph's: planning took about 0.14 ms of a step)."""
        ggml = self._ops.ggml
        # The output head's count: `ggml_threads()`, or what the bench fixed for every matrix (`use_threads`).
        threads = self._threads.threads
        plan = None if plans is None else plans.get(threads)
        if plan is None:
            plan = ggml.graph_plan(graph, threads, ggml.shared_threadpool(threads, GGML_POLL))
            if plans is not None:
                plans[threads] = plan
        size = max(int(plan.work_size), 1)
        if self._work is None or len(self._work) < size:
            self._work = ctypes.create_string_buffer(size)
        plan.work_data = ctypes.addressof(self._work)
        status = ggml.graph_compute(graph, ctypes.byref(plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned {status}")


def _append(cache: KVCache | BatchKVCache, keys: mx.array, values: mx.array, rows: int) -> None:
    """Append a step's keys and values to `cache` through mlx: `update_and_fetch`, or where one sequence's buffers
    have room the assignment it makes then, into new arrays (`append_through_mlx`), which settle the buffers as the
    cache's own."""
    if type(cache) is OwnedKVCache and has_room(cache, rows):
        append_through_mlx(cache, keys, values)
        return
    cache.update_and_fetch(keys, values)


def _arrays(cache: KVCache | BatchKVCache) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """numpy views of a cache's key and value buffers (read without counting as an outside use)."""
    keys, values = buffers_of(cache)
    return np.asarray(keys), np.asarray(values)


def _writable(pair: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]], end: int) -> bool:
    """Whether a step can write one sequence's positions up to `end` into these buffers as rows of head dim values
    (kv heads × capacity rows, in that order)."""
    return all(
        array.shape[0] == 1
        and end <= array.shape[2]
        and array.strides[2] == 4 * array.shape[3]
        and array.strides[1] == array.strides[2] * array.shape[2]
        for array in pair
    )


def _cached(
    ops: GgmlGraphOps, context: int, whole: int, array: npt.NDArray[np.float32], *, index: int, start: int, count: int
) -> int:
    """Sequence `index`'s `count` cached positions from `start` in one layer's keys or values, as a view [head dim,
    count, kv heads] of mlx's memory."""
    _, kv_heads, _, head_dim = array.shape
    offset = index * array.strides[0] + start * array.strides[2]
    return ops.view_3d(context, whole, head_dim, count, kv_heads, array.strides[2], array.strides[1], offset)


def _batch_cached(
    ops: GgmlGraphOps, context: int, whole: int, array: npt.NDArray[np.float32], *, first: int, count: int
) -> int:
    """Every sequence's `count` cached positions from `first` in one layer's keys or values, as a view [head dim,
    count, kv heads, sequences] of mlx's memory."""
    batch, kv_heads, _, head_dim = array.shape
    strides = array.strides
    offset = first * strides[2]
    return ops.view_4d(context, whole, head_dim, count, kv_heads, batch, strides[2], strides[1], strides[0], offset)


def cache_view(ops: GgmlGraphOps, context: int, outside: int, array: npt.NDArray[np.float32], held: int) -> int:
    """The first `held` positions of mlx's batch × kv heads × capacity × head dim cache buffer (numpy's view of it),
    as a ggml view [head dim, held, kv heads, batch] of its memory (a flat tensor over it made in `outside`)."""
    batch, kv_heads, _, head_dim = array.shape
    strides = array.strides
    flat = _flat(ops, outside, array)
    return ops.view_4d(context, flat, head_dim, held, kv_heads, batch, strides[2], strides[1], strides[0], 0)


def _flat(ops: GgmlGraphOps, outside: int, array: npt.NDArray[np.float32]) -> int:
    """A flat float32 tensor (made in `outside`, a context that allocates nothing) over all of `array`'s memory."""
    extent = sum((size - 1) * stride for size, stride in zip(array.shape, array.strides, strict=True)) + 4
    flat = ops.new_tensor_1d(outside, _F32, extent // 4)
    ops.set_data(flat, array.ctypes.data)
    return flat


def _write_rows(
    ops: GgmlGraphOps,
    context: int,
    outside: int,
    *,
    array: npt.NDArray[np.float32],
    new: int,
    rows: int,
    shape: Shape,
    count: int,
) -> int:
    """Write a step's new keys or values (head dim × kv heads × tokens) into mlx's buffer `array` ([1, kv heads,
    capacity, head dim], one sequence) at the rows `rows` names (`_StepGraph.write`)."""
    _, kv_heads, capacity, head_dim = array.shape
    destination = ops.new_tensor_2d(outside, _F32, head_dim, kv_heads * capacity)
    ops.set_data(destination, array.ctypes.data)
    source = ops.reshape_2d(context, new, shape.head_dim, shape.kv_heads * count)
    return ops.set_rows(context, destination, source, rows)


def _biased(ops: GgmlGraphOps, context: int, product: int, bias: int | None) -> int:
    return product if bias is None else ops.add(context, product, bias)


def _free(ops: GgmlGraphOps, parameters: int, passes: "_PassAllocator", steps: "_Steps") -> None:
    steps.close()
    ops.free(parameters)
    passes.release()


class _PassAllocator:
    """ggml-alloc's graph allocator for layer passes over many rows, made at the first pass: its buffer grows to the
    largest pass (32.5 MiB for a 512-token prefill piece of the default model) and is reused from node to node, as
    llama.cpp allocates its graphs. Each pass allocates its graph before it runs, so `release` may free the buffer
    between passes; the next pass makes a new one."""

    def __init__(self, ops: GgmlGraphOps) -> None:
        self._ops = ops
        self._allocator = 0

    @property
    def nbytes(self) -> int:
        return int(self._ops.gallocr_get_buffer_size(self._allocator, 0)) if self._allocator else 0

    def allocate(self, graph: int) -> None:
        if not self._allocator:
            self._allocator = int(self._ops.gallocr_new(self._ops.cpu_buffer_type()))
        if not self._ops.gallocr_alloc_graph(self._allocator, graph):
            raise MemoryError("ggml could not allocate a graph's tensors")

    def release(self) -> None:
        if self._allocator:
            self._ops.gallocr_free(self._allocator)
            self._allocator = 0


_LIVE: Final["weakref.WeakSet[DecodeGraph]"] = weakref.WeakSet()
"""Every decode graph of the process (a runner's model has one; a split model's rank one too)."""


def release_idle_buffers() -> None:
    """Free what every decode graph keeps from one pass or step to the next: the layer passes' buffer, the read-back
    buffer and the kept step graphs. For a runner with no request running: a kept step graph serves only the caches it
    was built for, which a finished request took with it, and the next prompt's first piece and first steps allocate
    and build again (milliseconds, against the seconds a piece takes)."""
    for graph in list(_LIVE):
        graph._release_buffers()  # pyright: ignore[reportPrivateUsage] -- this module's own


def write_int32(address: int, values: Sequence[int]) -> None:
    (ctypes.c_int32 * len(values)).from_address(address)[:] = list(values)


def read_floats(address: int, count: int) -> npt.NDArray[np.float32]:
    values = np.empty(count, dtype=np.float32)
    ctypes.memmove(values.ctypes.data, address, 4 * count)
    return values


def for_cache(values: npt.NDArray[np.float32], shape: Shape, batch: int, rows: int) -> mx.array:
    """A step's new keys or values (token by token, sequence by sequence) as mlx-lm's caches take them: sequences ×
    kv heads × rows × head dim."""
    return mx.array(values.reshape(batch, rows, shape.kv_heads, shape.head_dim).transpose(0, 2, 1, 3))


def _floats_at(address: int, count: int) -> npt.NDArray[np.float32]:
    """`count` float32 values at `address`, as a numpy view (no copy: valid until the memory is reused)."""
    return np.ctypeslib.as_array((ctypes.c_float * count).from_address(address))


def _span_end(sequences: Sequences, *, capacity: int) -> int:
    """Where a new step graph's views of the cache end in its buffers: the next multiple of SPAN_STEP after the
    positions held (within the buffers' capacity)."""
    end = sequences.end
    return min(end - end % SPAN_STEP + SPAN_STEP, capacity)


def _new_rows_mask(span: int, rows: int, group: int) -> npt.NDArray[np.float32]:
    """A sequence's mask over `span` cached positions and `rows` new ones (rows × 1 × group × span + rows), its new
    rows' part written: row r sees the new rows up to its own. `_StepGraph.write` masks the cached positions."""
    mask = np.zeros((rows, 1, group, span + rows), dtype=np.float32)
    hidden = np.arange(rows)[None, :] > np.arange(rows)[:, None]
    mask[:, 0, :, span:] = np.where(hidden, np.float32(-np.inf), np.float32(0))[:, None, :]
    return mask


_Buffers = tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]
"""Each layer's key and value buffers, in order, as a step graph's key names them: address, shape, strides."""


@dataclass(frozen=True)
class _StepKey:
    """What a step graph is built for: the rows a sequence, where each sequence starts in its buffers, and the
    buffers themselves (mlx keeps a cache's buffer in place from step to step until it grows it)."""

    rows: int
    starts: tuple[int, ...]
    buffers: "_Buffers"
    in_place: bool
    """The graph writes the step's keys and values into the buffers (one sequence whose cache owns them)."""

    @property
    def batched(self) -> bool:
        """A one-token step of several sequences: their attention is one set of nodes (`_batch_attention`)."""
        return self.rows == 1 and len(self.starts) > 1

    @classmethod
    def of(
        cls,
        views: Sequence[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]],
        sequences: Sequences,
        rows: int,
        *,
        in_place: bool,
    ) -> "_StepKey":
        buffers = tuple((int(array.ctypes.data), array.shape, array.strides) for pair in views for array in pair)
        return cls(rows=rows, starts=sequences.starts, buffers=buffers, in_place=in_place)


@dataclass(frozen=True)
class _StepGraph:
    """A built and allocated step graph, run again for each step its key and span serve."""

    key: _StepKey
    end: int
    """Where its views of the cache end in the buffers."""
    contexts: tuple[int, int]
    graph: int
    ids: int
    """The address of the token ids' input (the rows of `embedded` to look up); `positions` likewise."""
    positions: int
    embedded: int
    """The address of the step's tokens' rows of the embedding table (blocks, one row a token)."""
    masks: Sequence[npt.NDArray[np.float32]]
    """Each sequence's attention mask (the graph reads this memory)."""
    logits: int
    appended: Sequence[tuple[int, int]]
    """Each layer's new keys and values (outputs)."""
    cache_rows: int
    """The address of the cache rows an in-place step writes (`_StepKey.in_place`; 0 otherwise)."""
    allocator: int
    """ggml-alloc's allocator whose buffer holds this graph's intermediate tensors (its own)."""
    plans: dict[int, ComputePlan] = field(default_factory=dict[int, ComputePlan])
    """ggml's plan for running this graph, by thread count (`DecodeGraph.compute`)."""

    def serves(self, key: _StepKey, sequences: Sequences) -> bool:
        """Whether this graph computes a step of `key` with `sequences` held: its views reach them, masking at most
        SPAN_STEP positions (a trimmed cache gets a new graph rather than attention over what it dropped)."""
        return key == self.key and self.end - SPAN_STEP <= sequences.end <= self.end

    def write(self, tokens: Sequence[int], sequences: Sequences, embedding: EmbeddingRows) -> None:
        """The step's inputs: its tokens' rows of `embedding`, positions, and each mask's cached part (0 where held,
        -inf past it)."""
        rows = self.key.rows
        embedding.read_into(tokens, self.embedded)
        write_int32(self.ids, range(len(tokens)))
        write_int32(self.positions, [held + row for held in sequences.held for row in range(rows)])
        if self.key.batched:  # sequence i's positions held are [start_i, end) of the buffers
            mask, first = self.masks[0], min(sequences.starts)
            span = self.end - first
            for index, (start, held) in enumerate(zip(sequences.starts, sequences.held, strict=True)):
                lead = start - first
                mask[index, ..., :lead] = -np.inf
                mask[index, ..., lead : lead + held] = 0
                mask[index, ..., lead + held : span] = -np.inf
        else:
            for mask, start, held in zip(self.masks, sequences.starts, sequences.held, strict=True):
                span = self.end - start
                mask[..., :held] = 0
                mask[..., held:span] = -np.inf
        if self.key.in_place:  # row h · capacity + position of kv head h's keys (one sequence, buffers [1, h, c, d])
            _, kv_heads, capacity, _ = self.key.buffers[0][1]
            first = sequences.held[0]
            rows_written = [head * capacity + first + row for row in range(rows) for head in range(kv_heads)]
            (ctypes.c_int64 * len(rows_written)).from_address(self.cache_rows)[:] = rows_written


class _Written:
    """What the last in-place step left: its caches (held weakly: a finished request's cache is not kept alive by
    this), their buffers' part of a step graph's key, and the positions they hold."""

    def __init__(self, caches: Sequence[OwnedKVCache], buffers: "_Buffers", *, end: int) -> None:
        self.buffers = buffers
        self.end = end
        self._caches = [weakref.ref(cache) for cache in caches]
        self._capacity = min(shape[2] for _, shape, _ in buffers)

    def untouched(self, caches: object, rows: int) -> list[OwnedKVCache] | None:
        """`caches` as a list of these caches, where it is them, in order, untouched since: each still owns its
        buffers and holds `end` positions (a trim changes the count; a read, a copy or new buffers make them shared,
        and a step through mlx starts in `DecodeGraph.logits`, which forgets this record), with room for `rows`
        more. Else None."""
        if type(caches) is not list or len(cast(list[object], caches)) != len(self._caches):
            return None
        if self.end + rows > self._capacity:
            return None
        owned: list[OwnedKVCache] = []
        for layer, cache in zip(cast(list[object], caches), self._caches, strict=True):
            if layer is not cache() or type(layer) is not OwnedKVCache:
                return None
            if layer.offset != self.end or state(layer) != "owned":
                return None
            owned.append(layer)
        return owned


class _Steps:
    """The step graphs kept between steps, most recently used last: a batch's shape changes rarely, but a request
    verifying drafts alternates one-row steps with passes of a few rows, and building a graph costs about 2 ms."""

    def __init__(self, ops: GgmlGraphOps) -> None:
        self._ops = ops
        self._kept: list[_StepGraph] = []

    def find(self, key: _StepKey, sequences: Sequences) -> _StepGraph | None:
        """A kept graph that computes a step of `key` with `sequences` held (`_StepGraph.serves`)."""
        for index, step in enumerate(self._kept):
            if step.serves(key, sequences):
                self._kept.append(self._kept.pop(index))
                return step
        return None

    def new_allocator(self) -> int:
        return int(self._ops.gallocr_new(self._ops.cpu_buffer_type()))

    def keep(self, step: _StepGraph) -> _StepGraph:
        """Keep `step`, freeing a graph of the same key (its span passed), another batch's (a batch's logits alone
        take a buffer of sequences × vocabulary floats: one batch graph is kept) and the least recently used past
        KEPT_STEPS."""
        batch = len(step.key.starts) > 1
        for old in [kept for kept in self._kept if kept.key == step.key or (batch and len(kept.key.starts) > 1)]:
            self._kept.remove(old)
            self._free(old)
        self._kept.append(step)
        while len(self._kept) > KEPT_STEPS:
            self._free(self._kept.pop(0))
        return step

    def __len__(self) -> int:
        return len(self._kept)

    def close(self) -> None:
        while self._kept:
            self._free(self._kept.pop())

    def _free(self, step: _StepGraph) -> None:
        for context in step.contexts:
            self._ops.free(context)
        self._ops.gallocr_free(step.allocator)


def _f32_tensor(ops: GgmlGraphOps, context: int, array: mx.array) -> int:
    values = np.ascontiguousarray(np.asarray(array.astype(mx.float32)), dtype=np.float32).reshape(-1)
    tensor = int(ops.new_tensor_1d(context, _F32, values.size))
    ctypes.memmove(ops.get_data(tensor), values.ctypes.data, values.nbytes)
    return tensor


def decode_graph_for(model: nn.Module, ggml: Ggml) -> DecodeGraph | None:
    """The whole-step graph of `model` when it is one this module computes exactly (a qwen2 or llama model of
    mlx-lm with every matrix a ggml layer, not split across nodes, NeoX rope without scaling), else None."""
    args = getattr(model, "args", None)
    inner = model.get("model")
    if args is None or getattr(args, "model_type", None) not in ARCHITECTURES or not isinstance(inner, nn.Module):
        return None
    if getattr(inner, "pipeline_size", 1) != 1:  # one stage of mlx-lm's own pipeline: its steps pass other ranks
        return None
    embedding = inner.get("embed_tokens")
    layers = cast(list[nn.Module], inner.get("layers") or [])
    if not isinstance(embedding, (Q8Embedding, FileEmbedding)) or not layers:
        return None
    if len(layers) != getattr(args, "num_hidden_layers", -1):
        return None
    head_module = model.get("lm_head")
    if head_module is None:
        head = embedding.q8 if isinstance(embedding, Q8Embedding) else None
    else:
        head = _weights(head_module)
    if head is None:
        return None
    first = layers[0]["self_attn"]
    rope = first.get("rope")
    if not isinstance(rope, nn.RoPE) or rope.traditional or rope.scale != 1.0:
        return None
    heads, kv_heads = int(first.n_heads), int(first.n_kv_heads)
    head_dim = int(rope.dims)
    shape = Shape(
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        norm_eps=float(inner["norm"].eps),
        rope_base=float(rope.base),
        scale=float(first.scale),
    )
    q_proj = first.get("q_proj")
    if heads % kv_heads or not isinstance(q_proj, Q8Linear) or head_dim * heads != q_proj.q8.shape[0]:
        return None
    ops = graph_ops(ggml)
    hidden = embedding.rows.shape[1]
    floats = len(layers) * (2 * hidden + 2 * (heads + kv_heads) * head_dim) + hidden
    parameters = ops.new_context(4 * floats + (6 * len(layers) + 4) * int(ggml.tensor_overhead()) + 4096)
    try:
        built = [_layer_for(layer, ops, parameters, shape) for layer in layers]
        if any(layer is None for layer in built):
            ops.free(parameters)
            return None
        norm = _f32_tensor(ops, parameters, inner["norm"].weight)
    except Exception:
        ops.free(parameters)
        raise
    return DecodeGraph(
        ops,
        shape=shape,
        layers=[layer for layer in built if layer is not None],
        embedding=embedding.rows,
        norm=norm,
        head=head,
        parameters=parameters,
    )


def _weights(module: object) -> Q8Weights | None:
    """A bias-free ggml layer's weights (the untied output head)."""
    if type(module) is not Q8Linear or "bias" in module:
        return None
    return module.q8


def _layer_for(layer: nn.Module, ops: GgmlGraphOps, context: int, shape: Shape) -> _Layer | None:
    attention, mlp = layer.get("self_attn"), layer.get("mlp")
    if not isinstance(attention, nn.Module) or not isinstance(mlp, SwiGluMlp):
        return None
    rope = attention.get("rope")
    if not isinstance(rope, nn.RoPE) or rope.traditional or rope.scale != 1.0 or float(rope.base) != shape.rope_base:
        return None
    projections = [attention.get(name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    if not all(isinstance(p, Q8Linear) and type(p) is Q8Linear for p in projections):
        return None
    q, k, v, o = cast(list[Q8Linear], projections)
    if "bias" in o or type(mlp.down_proj) is not Q8Linear:
        return None

    def bias(linear: Q8Linear) -> int | None:
        return _f32_tensor(ops, context, linear["bias"]) if "bias" in linear else None

    return _Layer(
        input_norm=_f32_tensor(ops, context, layer["input_layernorm"].weight),
        post_norm=_f32_tensor(ops, context, layer["post_attention_layernorm"].weight),
        q=q.q8.matrix,
        k=k.q8.matrix,
        v=v.q8.matrix,
        q_bias=bias(q),
        k_bias=bias(k),
        v_bias=bias(v),
        o=o.q8.matrix,
        gate=mlp.gate_proj.q8.matrix,
        up=mlp.up_proj.q8.matrix,
        down=mlp.down_proj.q8.matrix,
    )


class _DecodeGraphCall(nn.Module):
    """The call of a model with a `DecodeGraph` installed (`install_decode_graph` makes the model an instance of a
    subclass of its own class and this): a decode step (one token for each sequence) over mlx-lm KV caches runs as
    the one graph; every other call (prefill, verifying a draft, no cache) is the model's own."""

    decode_graph: DecodeGraph

    def __call__(self, inputs: mx.array, cache: object = None, *args: object, **kwargs: object) -> mx.array:
        if _graph_call(inputs, args, kwargs):
            graph = self.decode_graph
            logits = graph.resume(inputs, cache) if inputs.shape[0] == 1 else None
            if logits is not None:
                return logits
            caches = _decode_caches(inputs, cache, graph.layers)
            if caches is not None:
                mx.eval(inputs, *[array for layer in caches for array in _held_arrays(layer)])
                for layer in caches:
                    settle(layer)
                logits = graph.logits(_token_ids(inputs), caches, rows=inputs.shape[1])
                if logits is not None:
                    return logits
        return cast(mx.array, super().__call__(inputs, cache, *args, **kwargs))  # pyright: ignore[reportUnknownMemberType]


def install_decode_graph(model: nn.Module, graph: DecodeGraph) -> None:
    """Make `model`'s decode steps run as `graph` (a subclass of its own class that dispatches them, `mix_in`)."""
    mix_in(model, _DecodeGraphCall)
    cast(_DecodeGraphCall, model).decode_graph = graph


def decode_graph_of(model: nn.Module) -> DecodeGraph | None:
    """The graph installed on `model`, if any."""
    return model.decode_graph if isinstance(model, _DecodeGraphCall) else None


def _decode_caches(inputs: mx.array, cache: object, layers: int) -> list[KVCache] | list[BatchKVCache] | None:
    """The caches of a call of a shape the graph computes (`_graph_call`): every layer's cache an mlx-lm KVCache
    (one sequence) or BatchKVCache (a batch, not mid-prefill), in float32, all at the same place (else None)."""
    if not isinstance(cache, list) or len(cast(list[object], cache)) != layers:
        return None
    caches = cast(list[object], cache)
    if all(is_plain_kv_cache(layer) for layer in caches):
        kind: type = KVCache
    elif all(type(layer) is BatchKVCache for layer in caches):
        kind = BatchKVCache
    else:
        return None
    if kind is KVCache:
        return _single(cast(list[KVCache], caches)) if inputs.shape[0] == 1 else None
    return _batch(cast(list[BatchKVCache], caches), inputs.shape[0]) if inputs.shape[1] == 1 else None


def _graph_call(inputs: mx.array, args: tuple[object, ...], kwargs: dict[str, object]) -> bool:
    """Whether a call is of a shape the graph computes, its caches aside (`_decode_caches`): one token for each
    sequence (or up to MAX_PASS_TOKENS of one), no input embeddings, its logits wanted."""
    if args or any(value is not None for value in kwargs.values()) or logits_are_discarded():
        return False
    if inputs.ndim != 2 or not 0 < inputs.shape[0] <= MAX_SEQUENCES:
        return False
    return inputs.shape[1] == 1 or (inputs.shape[0] == 1 and 1 < inputs.shape[1] <= MAX_PASS_TOKENS)


def _token_ids(inputs: mx.array) -> list[int]:
    """A call's token ids, sequence by sequence (numpy's view evaluates them)."""
    return cast(list[int], np.asarray(inputs).reshape(-1).tolist())


def _held_arrays(layer: KVCache | BatchKVCache) -> tuple[mx.array, ...]:
    return tuple(array for array in buffers_of(layer) if array is not None)


def _single(caches: list[KVCache]) -> list[KVCache] | None:
    offset = caches[0].offset
    for layer in caches:
        keys, values = buffers_of(layer)
        if keys is None or values is None or layer.offset != offset or offset <= 0:
            return None
        if keys.dtype != mx.float32 or values.dtype != mx.float32:
            return None
    return caches


def _batch(caches: list[BatchKVCache], count: int) -> list[BatchKVCache] | None:
    end = caches[0]._idx  # pyright: ignore[reportPrivateUsage]
    for layer in caches:
        keys, values = layer.keys, layer.values
        if keys is None or values is None or layer._idx != end or layer._right_padding is not None:  # pyright: ignore[reportPrivateUsage]
            return None
        if keys.dtype != mx.float32 or values.dtype != mx.float32 or keys.shape[0] != count:
            return None
    return caches
