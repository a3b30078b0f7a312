"""A GGUF's matrices held in ggml's repacked layout (`ggml_repack.py`, `EXO_GGML_REPACK`, issue 33): where ggml
chooses an interleaved layout for a matrix on this CPU (Q4_0 and Q4_K with AVX2 on x86), its products over 1 to 64
rows are those of the blocks as stored; where it chooses none, the matrix is held as stored; a repacked matrix refuses
every read of its blocks but a Q4_K matrix's read-back, which gives exactly the blocks it was given; a model served
with it decodes as with the blocks as stored, and its passes over many rows (read back) compute exactly what the
stored blocks compute.

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR), and the repacked layouts an x86 CPU
with AVX2: elsewhere they skip for a reason of the machine, a failure under EXO_STRICT_SKIPS=1.
"""

from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu import engine, ggml_repack
from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
from exo.worker.engines.mlx.cpu.ggml_library import Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.ggml_repack import READ_BACK_ROWS, q4_k_from_8x8
from exo.worker.engines.mlx.cpu.q8_layers import Q8Linear
from exo.worker.engines.mlx.model_loader import load_model
from tests.machine_skips import skip_for_machine
from tests.worker.engines.mlx.cpu import gguf_export
from tests.worker.engines.mlx.cpu.weight_formats import assert_within_product_rounding, loaded_fixture


def _avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.fixture
def repacking(ggml: Ggml) -> Ggml:
    if not _avx2():
        skip_for_machine("ggml's repacked layouts here are for x86 CPUs with AVX2")
    return ggml


def _stored(ggml: Ggml, type_name: str, rows: int, width: int, seed: int) -> GgmlMatrix:
    """A matrix of random values quantized by ggml itself to `type_name`, held as stored."""
    matrix = GgmlMatrix(ggml, type_name, rows, width)
    matrix.fill(0, np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32))
    return matrix


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K"])
def test_a_repacked_matrix_multiplies_as_its_blocks_as_stored(repacking: Ggml, type_name: str) -> None:
    stored = _stored(repacking, type_name, 64, 512, seed=1)
    repacked = GgmlMatrix.repacked_from_blocks(repacking, type_name, 64, 512, stored.blocks)
    assert repacked is not None
    assert repacked.repacked
    assert not stored.repacked
    assert repacked.nbytes == stored.nbytes
    pool = repacking.shared_threadpool(2)
    for rows in (1, 3, 8, 64):
        x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
        ours, theirs = repacked.product(x, 2, pool), stored.product(x, 2, pool)
        assert ours.shape == theirs.shape == (rows, 64)
        # The same integer sums, added in another order: float32 rounding apart, no more.
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * float(np.abs(theirs).max()))


def test_a_matrix_ggml_has_no_layout_for_stays_as_stored(repacking: Ggml) -> None:
    q6_k = _stored(repacking, "Q6_K", 64, 512, seed=2)
    assert GgmlMatrix.repacked_from_blocks(repacking, "Q6_K", 64, 512, q6_k.blocks) is None
    odd_rows = _stored(repacking, "Q4_0", 60, 512, seed=3)  # interleaving takes 8 rows at a time
    assert GgmlMatrix.repacked_from_blocks(repacking, "Q4_0", 60, 512, odd_rows.blocks) is None


def test_a_repacked_matrix_refuses_to_be_read_as_blocks(repacking: Ggml) -> None:
    stored = _stored(repacking, "Q4_0", 16, 256, seed=4)
    repacked = GgmlMatrix.repacked_from_blocks(repacking, "Q4_0", 16, 256, stored.blocks)
    assert repacked is not None
    with pytest.raises(ValueError, match="repacked"):
        _ = repacked.blocks
    with pytest.raises(ValueError, match="repacked"):
        repacked.dequantize(0, 1, np.empty(256, dtype=np.float32))
    with pytest.raises(ValueError, match="repacked"):
        repacked.fill(0, np.zeros((1, 256), dtype=np.float32))


@pytest.mark.parametrize(("rows", "width"), [(8, 256), (64, 512), (24, 1536)])
def test_a_repacked_q4_k_matrix_reads_back_exactly_the_blocks_it_was_given(
    repacking: Ggml, rows: int, width: int
) -> None:
    stored = _stored(repacking, "Q4_K", rows, width, seed=rows)
    repacked = GgmlMatrix.repacked_from_blocks(repacking, "Q4_K", rows, width, stored.blocks, measured_only=True)
    assert repacked is not None
    assert repacked.reads_back
    restored = np.zeros_like(stored.blocks)
    repacked.read_back(restored)
    np.testing.assert_array_equal(restored, stored.blocks)


def test_a_layout_that_does_not_read_back_exactly_is_not_kept_where_only_measured_layouts_are(
    repacking: Ggml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load-time check: a Q4_K layout whose read-back does not give the file's blocks (as another CPU's layout
    would) is refused under the measured policy and kept, unread, under `all`; Q4_0, measured faster repacked at
    every row count, is kept without a read-back."""
    q4_k = _stored(repacking, "Q4_K", 16, 256, seed=6)
    monkeypatch.setitem(ggml_repack.READ_BACKS, "Q4_K", lambda _, out: out.fill(0))
    assert GgmlMatrix.repacked_from_blocks(repacking, "Q4_K", 16, 256, q4_k.blocks, measured_only=True) is None
    kept = GgmlMatrix.repacked_from_blocks(repacking, "Q4_K", 16, 256, q4_k.blocks)
    assert kept is not None
    assert kept.repacked
    assert not kept.reads_back
    with pytest.raises(ValueError, match="reads back"):
        kept.read_back(np.empty_like(q4_k.blocks))
    q4_0 = _stored(repacking, "Q4_0", 16, 256, seed=5)
    throughout = GgmlMatrix.repacked_from_blocks(repacking, "Q4_0", 16, 256, q4_0.blocks, measured_only=True)
    assert throughout is not None
    assert throughout.repacked
    assert not throughout.reads_back


def test_reading_back_refuses_bytes_of_another_shape() -> None:
    with pytest.raises(ValueError, match="block_q4_Kx8"):
        q4_k_from_8x8(np.zeros(6 * 144, dtype=np.uint8), np.zeros((6, 144), dtype=np.uint8))  # 6 rows: no group of 8
    with pytest.raises(ValueError, match="block_q4_Kx8"):
        q4_k_from_8x8(np.zeros(8 * 144, dtype=np.uint8), np.zeros((8, 288), dtype=np.uint8))


def _repacked_matrices(model: object) -> list[GgmlMatrix]:
    layers = model["model"]["layers"]  # pyright: ignore[reportIndexIssue, reportUnknownVariableType]
    return [
        module.q8.matrix
        for layer in layers  # pyright: ignore[reportUnknownVariableType]
        for _, module in layer.named_modules()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if isinstance(module, Q8Linear) and module.q8.matrix.repacked
    ]


def _repacked_layers(model: object) -> int:
    return len(_repacked_matrices(model))


def test_a_long_pass_reads_q4_k_matrices_back_and_computes_exactly_what_the_stored_blocks_compute(
    repacking: Ggml, tmp_path: Path
) -> None:
    """A random model wide enough for Q4_K (256), exported with Q4_K matrices, loaded three ways: by default its
    layers' matrices are held repacked and read back; a prefill of more than `READ_BACK_ROWS` tokens then gives
    bit for bit the logits of the same file held as stored (`off`: the same bytes, the same kernels), and `on`
    (repacked kernels over the long pass too) within the products' rounding; decode steps (repacked kernels) agree
    within that rounding."""
    exported = gguf_export.export_wide(repacking, tmp_path, "Q4_K")

    def loaded(setting: str) -> object:
        kernels = engine.CpuKernels("auto", environment={engine.REPACK_VARIABLE: setting}, weights="gguf")
        return load_model(exported, ShardAssignment(), cpu_kernels=kernels).model

    models = {setting: loaded(setting) for setting in ("", "off", "on")}
    read_back = _repacked_matrices(models[""])
    assert len(read_back) == 2 * 7
    assert all(matrix.reads_back for matrix in read_back)
    assert not _repacked_matrices(models["off"])
    assert len(_repacked_matrices(models["on"])) == 2 * 7
    prompt = mx.array([[(index * 7) % 150 + 3 for index in range(READ_BACK_ROWS + 44)]])
    outputs: dict[str, list[np.ndarray]] = {}
    for setting, model in models.items():
        cache = make_prompt_cache(model)  # pyright: ignore[reportArgumentType]
        logits = model(prompt, cache=cache)  # pyright: ignore[reportCallIssue, reportUnknownVariableType]
        steps = [np.array(logits[0, -1])]  # pyright: ignore[reportUnknownArgumentType]
        for token in (5, 9, 11, 13):  # the same steps for every model: each one's own argmax could part at a tie
            logits = model(mx.array([[token]]), cache=cache)  # pyright: ignore[reportCallIssue, reportUnknownVariableType]
            steps.append(np.array(logits[0, -1]))  # pyright: ignore[reportUnknownArgumentType]
        outputs[setting] = steps
    graph = decode_graph_of(models[""])  # pyright: ignore[reportArgumentType]
    assert graph is not None
    assert graph.read_back_bytes >= max(matrix.nbytes for matrix in read_back)
    np.testing.assert_array_equal(outputs[""][0], outputs["off"][0])
    assert_within_product_rounding(outputs["on"][0], outputs["off"][0])
    for ours, theirs in zip(outputs[""][1:], outputs["off"][1:], strict=True):
        assert_within_product_rounding(ours, theirs)


@pytest.mark.usefixtures("repacking")
def test_a_model_served_repacked_decodes_as_with_its_blocks_as_stored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fixture exported with Q4_0 matrices (of rows ggml interleaves): by default its layers' matrices are held
    repacked (its embedding never: lookups read blocks; EXO_GGML_REPACK=off holds them as stored) and the report
    says so; prefill and greedy steps through the decode graph give the logits of the same file served as stored."""
    monkeypatch.setattr(gguf_export, "MATRIX_TYPES", {"weight": gguf.GGMLQuantizationType.Q4_0})
    source = gguf_export.export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    monkeypatch.setenv(engine.REPACK_VARIABLE, "off")
    assert not engine.CpuKernels("auto", weights="gguf").on("repacked_blocks")
    stored = loaded_fixture("tiny-qwen-tools", "gguf", source).model
    monkeypatch.delenv(engine.REPACK_VARIABLE)  # the default: Q4_0 is measured to pay repacked
    kernels = engine.CpuKernels("auto", weights="gguf")
    assert kernels.on("repacked_blocks")
    repacked = loaded_fixture("tiny-qwen-tools", "gguf", source).model
    assert _repacked_layers(repacked) > 0
    assert _repacked_layers(stored) == 0
    assert decode_graph_of(repacked) is not None
    prompt = mx.array([[(index * 7) % 150 + 3 for index in range(20)]])
    outputs: list[list[np.ndarray]] = []
    for model in (repacked, stored):
        cache = make_prompt_cache(model)
        logits = model(prompt, cache=cache)
        steps = [np.array(logits[0, -1])]
        for _ in range(6):
            logits = model(mx.array([[int(np.argmax(steps[-1]))]]), cache=cache)
            steps.append(np.array(logits[0, -1]))
        outputs.append(steps)
    for ours, theirs in zip(*outputs, strict=True):
        assert_within_product_rounding(ours, theirs)
        assert int(np.argmax(ours)) == int(np.argmax(theirs))
