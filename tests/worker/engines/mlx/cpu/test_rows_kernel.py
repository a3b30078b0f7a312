"""exo's multi-row products for Q8_0, Q5_0 and Q6_K matrices (`rows_kernel.cpp`, `rows_kernel.py`, issue 33): the
same products as ggml's `ggml_mul_mat` on the same blocks (Q8_0 and Q5_0: both quantize the rows to Q8_0 the same
way, so they differ only in the order floats are summed; Q6_K: exo quantizes the rows per 32 values, ggml per 256),
within the blocks' rounding of the float32 product and no further from it than ggml's, for every row count the
kernel takes; and a batched decode step of a fixture model through them writes the greedy tokens and logits it
writes through ggml's products.

They need ggml built with `uv run exo ggml build` on an x86-64 CPU with AVX-512 VNNI or AVX-VNNI (the build
compiles the kernel beside ggml); without it they skip for a reason of the machine.
"""

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.models.cache import make_prompt_cache

from bench.ggml_kernels import RowsProduct
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES, Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.ggml_repack import READ_BACK_ROWS
from exo.worker.engines.mlx.cpu.rows_kernel import ROWS_KERNEL_VARIABLE, RowsKernel, rows_kernel
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, FixtureModelName
from tests.machine_skips import skip_for_machine
from tests.worker.engines.mlx.cpu.gguf_export import export_wide
from tests.worker.engines.mlx.cpu.test_decode_graph import (
    PROMPT,
    _batched,  # pyright: ignore[reportPrivateUsage]
    _left_padded,  # pyright: ignore[reportPrivateUsage]
)
from tests.worker.engines.mlx.cpu.weight_formats import assert_within_product_rounding, graph_and_plain

THREADS = 2


@pytest.fixture
def kernel(ggml: Ggml) -> RowsKernel:
    found = rows_kernel(ggml.library_dir)
    if found is None:
        skip_for_machine(
            f"no exo multi-row kernel beside {ggml.library_dir} (`uv run exo ggml build` on x86-64 with VNNI)"
        )
    return found


@dataclass(frozen=True)
class Format:
    type_name: str
    in_features: int
    vs_ggml: float
    """Largest difference from ggml's product, relative to the product's largest value."""
    vs_float32: float


@pytest.mark.parametrize(
    "form",
    [
        Format("Q8_0", 256, vs_ggml=1e-5, vs_float32=0.03),
        Format("Q5_0", 256, vs_ggml=1e-5, vs_float32=0.08),  # 5-bit weights round coarser than 8-bit ones
        # Q6_K's rows: exo quantizes them per 32 values, ggml per 256 (Q8_K): the two round apart, exo's the closer.
        Format("Q6_K", 512, vs_ggml=0.06, vs_float32=0.03),
    ],
    ids=lambda form: form.type_name,
)
@pytest.mark.parametrize("out_features", [100, 896])  # 100: the last group of 8 or 16 outputs is short
def test_products_are_ggmls_for_every_row_count_the_kernel_takes(
    ggml: Ggml, kernel: RowsKernel, form: Format, out_features: int
) -> None:
    type_name, in_features = form.type_name, form.in_features
    rng = np.random.default_rng(7)
    weights = (rng.standard_normal((out_features, in_features)) * 0.05).astype(np.float32)
    matrix = GgmlMatrix(ggml, type_name, out_features, in_features)
    try:
        matrix.fill(0, weights)
        fewest = kernel.fewest_rows(GGML_TYPES[type_name], in_features)
        most = kernel.most_rows[GGML_TYPES[type_name]]
        assert 0 < fewest <= most
        # Every row count one register of rows takes (up to 16); beyond (with AVX-512) the panels': one chunk short
        # of 16, a panel of 64 and a second one short.
        counts = [*range(fewest, min(most, 16) + 1), *[rows for rows in (17, 64, 101) if rows <= most]]
        for rows in counts:
            x = activations(rng, rows, in_features)
            product = RowsProduct.create(ggml, kernel, weights, type_name=type_name, rows=rows, threads=THREADS)
            try:  # the same blocks: ggml quantizes the same weights the same way
                ours = product.run(x)
            finally:
                product.close()
            theirs = matrix.product(x, THREADS, ggml.shared_threadpool(THREADS))
            exact = x @ weights.T
            scale = float(np.abs(exact).max())
            assert float(np.abs(ours - theirs).max()) < form.vs_ggml * scale, (type_name, rows)
            # Within the blocks' rounding of the float32 product (the outlier coarsens its rows' blocks).
            error = float(np.abs(ours - exact).max())
            assert error < form.vs_float32 * scale, (type_name, rows)
            assert error <= 1.01 * float(np.abs(theirs - exact).max()) + 1e-6 * scale, (type_name, rows)
    finally:
        matrix.close()


@pytest.mark.parametrize("out_features", [96, 904])  # 12 and 113 groups of 8 outputs: thread shares of both parities
@pytest.mark.parametrize("in_features", [256, 768])
def test_repacked_q4_k_products_are_ggmls_for_every_row_count(
    ggml: Ggml, kernel: RowsKernel, out_features: int, in_features: int
) -> None:
    """Q4_K as ggml repacks it (`block_q4_Kx8`, what the engine holds): the kernel's product and ggml's repacked
    one over the same blocks, for one to 16 rows (one pass of registers), 17 (a short second chunk), 64 (a panel)
    and 101 (a second, short panel). exo quantizes the rows per 32 values, ggml per 256 (Q8_K): they round apart,
    exo's no further from float32 overall (root mean square)."""
    q4_k = GGML_TYPES["Q4_K"]
    if kernel.fewest_rows(q4_k, in_features) == 0:
        skip_for_machine("the kernel reads repacked Q4_K with AVX-512 VNNI only")
    rng = np.random.default_rng(11)
    weights = (rng.standard_normal((out_features, in_features)) * 0.05).astype(np.float32)
    stored = GgmlMatrix(ggml, "Q4_K", out_features, in_features)
    stored.fill(0, weights)
    repacked = GgmlMatrix.repacked_from_blocks(ggml, "Q4_K", out_features, in_features, stored.blocks)
    if repacked is None:
        skip_for_machine("ggml holds no repacked Q4_K here")
    dense = np.empty((out_features, in_features), dtype=np.float32)
    stored.dequantize(0, out_features, dense)  # the values the blocks hold
    try:
        assert kernel.applies(q4_k, in_features, 1, repacked=True)
        assert not kernel.applies(q4_k, in_features, 1, repacked=False)  # the blocks as stored are not its layout
        for rows in [*range(1, 17), 17, 64, 101]:
            x = activations(rng, rows, in_features)
            product = RowsProduct.create(
                ggml, kernel, weights, type_name="Q4_K", rows=rows, threads=THREADS, repacked=True
            )
            try:
                ours = product.run(x)
            finally:
                product.close()
            theirs = repacked.product(x, THREADS, ggml.shared_threadpool(THREADS))
            held = x.astype(np.float64) @ dense.T.astype(np.float64)  # the blocks' own product, rows unquantized
            scale = float(np.abs(held).max())

            # Rows rounded per 32 values and per 256 part most where an outlier coarsens ggml's whole 256 (seen:
            # up to 5% of the largest value apart, exo's within 1.7% of the blocks' own product, ggml's 5.4%).
            assert float(np.abs(ours - theirs).max()) < 0.08 * scale, rows
            assert float(np.abs(ours - held).max()) < 0.03 * scale, rows
            assert _rms(ours - held) < _rms(theirs - held), rows
    finally:
        stored.close()
        repacked.close()


def activations(rng: np.random.Generator, rows: int, in_features: int) -> np.ndarray:
    """Gaussian rows with an outlier channel, as real activations have, and one row's 32-value block of zeros (its
    quantized scale 0)."""
    x = rng.standard_normal((rows, in_features)).astype(np.float32)
    x[:, 3] *= 40.0
    x[rows // 2, 32:64] = 0.0
    return x


def _rms(error: np.ndarray) -> float:
    return float(np.sqrt(np.mean(error**2)))


@pytest.mark.parametrize("sequences", [1, 3, 9])
def test_a_q4_k_model_decodes_through_the_kernel_as_through_ggmls_repacked_products(
    ggml: Ggml, kernel: RowsKernel, sequences: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A model of Q4_K matrices, held repacked as the engine holds them: its prefill (a pass of 12 or 54 rows; one
    of 297 goes to the read-back) and decode steps (a row a sequence) go through the kernel, with the logits of
    ggml's repacked products within the products' rounding (the steps are fed the same tokens, so a near tie cannot
    part the two runs)."""
    if kernel.fewest_rows(GGML_TYPES["Q4_K"], 256) == 0:
        skip_for_machine("the kernel reads repacked Q4_K with AVX-512 VNNI only")
    exported = export_wide(ggml, tmp_path, "Q4_K")

    def loaded() -> nn.Module:
        kernels = CpuKernels("auto", weights="gguf")
        return exo_load_model(exported, ShardAssignment(), cpu_kernels=kernels).model

    ours_model = loaded()
    with monkeypatch.context() as switched:
        switched.setenv(ROWS_KERNEL_VARIABLE, "off")
        theirs_model = loaded()
    rows_taken = _rows_taken(monkeypatch)
    prompts = [PROMPT[offset : offset + 12 + 3 * offset] for offset in range(sequences)]
    ours = _fed(ours_model, prompts)
    prefill_rows = sequences * max(len(prompt) for prompt in prompts)  # the batch padded to its longest
    # A pass of READ_BACK_ROWS or more multiplies the matrices read back into their stored blocks: ggml's products.
    assert (prefill_rows in rows_taken) == (prefill_rows < READ_BACK_ROWS)
    assert sequences in rows_taken  # the decode steps'
    rows_taken.clear()
    theirs = _fed(theirs_model, prompts)
    assert not rows_taken
    for a, b in zip(ours, theirs, strict=True):
        assert_within_product_rounding(a, b)


def _rows_taken(monkeypatch: pytest.MonkeyPatch, method: str = "product") -> list[int]:
    """The row count of every product the kernel is given from now on (appended as graphs add them): through
    `method`, `product` (the stored and repacked layouts) or `packed_product`."""
    rows_taken: list[int] = []
    product = getattr(RowsKernel, method)

    def counted(self: RowsKernel, *args: object, rows: int, **kwargs: object) -> int:
        rows_taken.append(rows)
        return product(self, *args, rows=rows, **kwargs)

    monkeypatch.setattr(RowsKernel, method, counted)
    return rows_taken


def _fed(model: nn.Module, prompts: list[list[int]]) -> list[np.ndarray]:
    """The prompts prefilled as one left-padded batch, then four steps fed fixed tokens: each pass's last logits."""
    cache, rows = _left_padded(model, prompts)
    outputs: list[np.ndarray] = []
    for step in range(5):
        logits = model(rows, cache=cache)
        mx.eval(logits)
        outputs.append(np.array(logits[:, -1]))
        rows = mx.array([[5 + 4 * step + index] for index in range(len(prompts))])
    return outputs


def test_the_kernel_takes_q8_0_q5_0_and_q6_k_as_stored_and_q4_k_repacked_only(kernel: RowsKernel) -> None:
    q8, q5, q6k, q4k, q4 = (GGML_TYPES[name] for name in ("Q8_0", "Q5_0", "Q6_K", "Q4_K", "Q4_0"))
    assert kernel.applies(q8, 896, kernel.fewest_rows(q8, 896))
    assert kernel.applies(q5, 896, kernel.max_rows)
    assert kernel.applies(q6k, 4864, kernel.fewest_rows(q6k, 4864))
    assert not kernel.applies(q6k, 896, kernel.max_rows)  # rows of 896 values are not whole 256-value blocks
    for kind in (q8, q5, q6k):
        assert not kernel.applies(kind, 4864, kernel.fewest_rows(kind, 4864) - 1)  # one row at least stays ggml's
        assert not kernel.applies(kind, 4864, kernel.max_rows, repacked=True)  # it reads these as stored only
    for kind in (q8, q5, q6k):
        assert kernel.applies(kind, 4864, kernel.most_rows[kind])
        assert not kernel.applies(kind, 4864, kernel.most_rows[kind] + 1)
    if kernel.fewest_rows(q4k, 1536):  # AVX-512: Q4_K as ggml repacks it, never as stored
        assert kernel.applies(q4k, 1536, 1, repacked=True)
        assert not kernel.applies(q4k, 1536, 1)
    assert not kernel.applies(q4, 896, 8)
    assert not kernel.applies(q4, 896, 8, repacked=True)
    assert not kernel.applies(q8, 900, 8)


def test_with_avx_512_the_kernel_takes_any_rows_q8_0_and_q5_0_from_one(kernel: RowsKernel) -> None:
    q8, q5, q6k, q4k = (GGML_TYPES[name] for name in ("Q8_0", "Q5_0", "Q6_K", "Q4_K"))
    if kernel.max_rows == 16:  # AVX-512 VNNI: the outputs-in-lanes products, for any rows (prefill pieces too)
        assert (kernel.fewest_rows(q8, 896), kernel.fewest_rows(q5, 4864), kernel.fewest_rows(q4k, 8960)) == (1, 1, 1)
        # Q6_K from 2 rows over short rows (an output head's 1,536 values), 3 over long ones (a down projection's).
        assert (kernel.fewest_rows(q6k, 1536), kernel.fewest_rows(q6k, 2048), kernel.fewest_rows(q6k, 4864)) == (
            2,
            2,
            3,
        )
        assert kernel.applies(q8, 896, 512)
        assert kernel.applies(q5, 4864, 4096)
        assert kernel.applies(q6k, 4864, 17)
        assert kernel.applies(q4k, 1536, 4096, repacked=True)
    else:  # AVX-VNNI only: the rows-in-lanes products alone, 5 to 8 rows; no repacked Q4_K
        assert (kernel.fewest_rows(q8, 896), kernel.fewest_rows(q5, 896), kernel.fewest_rows(q6k, 1536)) == (5, 5, 5)
        assert kernel.fewest_rows(q4k, 1536) == 0
        assert kernel.most_rows[q8] == kernel.most_rows[q6k] == kernel.max_rows == 8


def test_the_kernel_is_turned_off_by_its_variable(
    ggml: Ggml, kernel: RowsKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ROWS_KERNEL_VARIABLE, "off")
    assert rows_kernel(ggml.library_dir) is None
    monkeypatch.delenv(ROWS_KERNEL_VARIABLE)
    assert rows_kernel(ggml.library_dir) is kernel


@pytest.mark.usefixtures("kernel")
# With AVX-512, 1: Q8_0 and Q5_0 through the kernel, Q6_K through ggml; 3, 6 and 9: Q6_K's too (from 2 or 3 rows by
# their length). With AVX-VNNI only, 6: the rows-in-lanes products (9: more rows than its lanes, ggml's).
@pytest.mark.parametrize("sequences", [1, 3, 6, 9])
@pytest.mark.parametrize("weights", ["q8_0", "gguf"])
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_batch_decodes_through_the_kernel_as_through_ggmls_products(
    name: FixtureModelName, weights: str, sequences: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph, plain = graph_and_plain(name, weights, monkeypatch, tmp_path, off=(ROWS_KERNEL_VARIABLE,))  # pyright: ignore[reportArgumentType]
    step, plain_step = decode_graph_of(graph), decode_graph_of(plain)
    assert step is not None
    assert plain_step is not None
    rows_taken = _rows_taken(monkeypatch)
    prompts = [PROMPT[offset : offset + 12 + 3 * offset] for offset in range(sequences)]  # left padding up to 24
    ours_logits, ours_tokens = _batched(graph, prompts, steps=5)
    assert sequences in rows_taken  # the batch's products went through the kernel
    rows_taken.clear()
    theirs_logits, theirs_tokens = _batched(plain, prompts, steps=5)
    assert not rows_taken
    assert ours_tokens == theirs_tokens
    # The prompts' prefill goes through the kernel too, its sums ordered apart from ggml's: where a value sits on a
    # rounding boundary of a later product's quantized input, one quantized value moves a step (seen: 1.6e-3 of the
    # largest logit, the q8_0 qwen fixture). A wrong block, scale or offset moves them by far more.
    for ours, theirs in zip(ours_logits, theirs_logits, strict=True):
        assert float(np.abs(ours - theirs).max()) < 1e-2 * float(np.abs(theirs).max())


@pytest.mark.parametrize("weights", ["q8_0", "gguf"])
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_prompt_is_prefilled_through_the_kernel_as_through_ggmls_products(
    kernel: RowsKernel, name: FixtureModelName, weights: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A 40-token prompt's layer passes multiply 40 rows at once: through the kernel's panels where it takes them
    (Q8_0 and Q5_0 with AVX-512), with the same next token and logits as through ggml's products."""
    if kernel.most_rows[GGML_TYPES["Q8_0"]] < len(PROMPT):
        skip_for_machine("the kernel takes no prefill pieces without AVX-512 VNNI")
    graph, plain = graph_and_plain(name, weights, monkeypatch, tmp_path, off=(ROWS_KERNEL_VARIABLE,))  # pyright: ignore[reportArgumentType]
    rows_taken = _rows_taken(monkeypatch)
    ours = _last_logits(graph, PROMPT)
    assert len(PROMPT) in rows_taken  # the prompt's products went through the kernel
    rows_taken.clear()
    theirs = _last_logits(plain, PROMPT)
    assert not rows_taken
    assert int(np.argmax(ours)) == int(np.argmax(theirs))
    assert float(np.abs(ours - theirs).max()) < 1e-2 * float(np.abs(theirs).max())  # as the batch test's, above


def _last_logits(model: nn.Module, prompt: list[int]) -> np.ndarray:
    logits = model(mx.array([prompt]), cache=make_prompt_cache(model))
    mx.eval(logits)
    return np.array(logits[0, -1])


@pytest.mark.usefixtures("kernel")
def test_the_runners_report_says_whether_its_batches_use_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report a runner logs and serves: on where the kernel is built and the decode graph runs, else why not."""

    def state(setting: str | None) -> str | None:
        if setting is None:
            monkeypatch.delenv(ROWS_KERNEL_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(ROWS_KERNEL_VARIABLE, setting)
        kernels = CpuKernels("auto", weights="q8_0")
        exo_load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment(), cpu_kernels=kernels)
        return next(
            item.why_off if not item.on else "on"
            for item in kernels.report().replacements
            if item.name == "rows_kernel"
        )

    assert state(None) == "on"
    assert state("off") == f"{ROWS_KERNEL_VARIABLE}=off"
    monkeypatch.delenv(ROWS_KERNEL_VARIABLE)
    assert not CpuKernels("auto", weights="float32").on("rows_kernel")
