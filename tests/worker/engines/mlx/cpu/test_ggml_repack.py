"""A GGUF's matrices held in ggml's repacked layout (`ggml_repack.py`, `EXO_GGML_REPACK=on`, issue 33): where ggml
chooses an interleaved layout for a matrix on this CPU (Q4_0 and Q4_K with AVX2 on x86), its products over 1 to 64
rows are those of the blocks as stored; where it chooses none, the matrix is held as stored; a repacked matrix refuses
every read of its blocks; and a model served with it decodes as with the blocks as stored.

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR), and the repacked layouts an x86 CPU
with AVX2: elsewhere they skip for a reason of the machine, a failure under EXO_STRICT_SKIPS=1.
"""

from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from exo.worker.engines.mlx.cpu import engine
from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
from exo.worker.engines.mlx.cpu.ggml_library import Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.q8_layers import Q8Linear
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


def _repacked_layers(model: object) -> int:
    layers = model["model"]["layers"]  # pyright: ignore[reportIndexIssue, reportUnknownVariableType]
    return sum(
        1
        for layer in layers  # pyright: ignore[reportUnknownVariableType]
        for _, module in layer.named_modules()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if isinstance(module, Q8Linear) and module.q8.matrix.repacked
    )


@pytest.mark.usefixtures("repacking")
def test_a_model_served_repacked_decodes_as_with_its_blocks_as_stored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fixture exported with Q4_0 matrices (of rows ggml interleaves): under EXO_GGML_REPACK=on its layers'
    matrices are held repacked (its embedding never: lookups read blocks) and the report says so; prefill and greedy
    steps through the decode graph give the logits of the same file served as stored."""
    monkeypatch.setattr(gguf_export, "MATRIX_TYPES", {"weight": gguf.GGMLQuantizationType.Q4_0})
    source = gguf_export.export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    stored = loaded_fixture("tiny-qwen-tools", "gguf", source).model
    monkeypatch.setenv(engine.REPACK_VARIABLE, "on")
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
