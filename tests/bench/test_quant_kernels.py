"""The kernel bench's command line and its Markdown, on made-up results (the measuring itself is not a test), and its
`exo rows` candidate's product, and Q4_K measured held interleaved as well."""

import argparse

import numpy as np
import numpy.typing as npt
import pytest

from bench.ggml_kernels import GgmlProduct, RowsProduct
from bench.quant_kernels import KernelReport, KernelResult, build_parser, parse_rows, parse_shape, time_call
from bench.quant_kernels_measure import _candidates  # pyright: ignore[reportPrivateUsage]
from bench.report_quant_kernels import render_kernels
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES, Ggml
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from exo.worker.engines.mlx.cpu.q8_layers import ggml_library
from exo.worker.engines.mlx.cpu.rows_kernel import RowsKernel, rows_kernel, rows_kernel_missing_reason
from tests.machine_skips import skip_for_machine


def test_shapes_and_rows_parse() -> None:
    assert parse_shape("151936x896") == (151936, 896)
    assert parse_rows("1,4,8,512") == [1, 4, 8, 512]
    arguments = build_parser().parse_args(["--rows", "2", "--shapes", "128x896", "896X896", "--threads", "1"])
    assert arguments.rows == [2]
    assert arguments.shapes == [(128, 896), (896, 896)]
    assert arguments.threads == 1


@pytest.mark.parametrize("text", ["896", "0x896", "ax896", "896x896x2", ""])
def test_bad_shapes_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="OUTxIN"):
        parse_shape(text)


@pytest.mark.parametrize("text", ["", "1,,2", "0", "-1", "one"])
def test_bad_rows_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
        parse_rows(text)


def _result(candidate: str, shape: tuple[int, int], rows: int, seconds: float, error: float) -> KernelResult:
    weight_bytes = shape[0] * shape[1]
    return KernelResult(
        candidate=candidate,
        out_features=shape[0],
        in_features=shape[1],
        rows=rows,
        seconds=seconds,
        repeats=3,
        weight_bytes=weight_bytes,
        stored_bytes=weight_bytes * 5 if "packed" in candidate else weight_bytes,
        max_relative_error=error,
    )


def test_render_gives_time_bandwidth_error_and_bytes() -> None:
    report = KernelReport(
        results=[
            _result("int8", (1000, 1000), 1, 0.0001, 0.01),
            _result("int8", (1000, 1000), 8, 0.0002, 0.02),
            _result("int8, packed", (1000, 1000), 1, 0.00005, 0.01),
            _result("int8", (2000, 1000), 1, 2.5, 0.03),
        ],
        unavailable={"ggml": "not built"},
        commit="abc1234",
        cpu="2 × Test CPU",
        load_before=(1.0, 2.0, 3.0),
        load_after=(1.5, 2.0, 3.0),
        command="uv run python -m bench.quant_kernels --rows 1,8",
        finished_utc="2026-11-28 12:00 UTC",
        blas="mkl from pypi: /work/checkout/.venv/lib/libmkl_rt.so.3 (LD_PRELOAD, INTEL threads)",
        threads=1,
    )
    text = "\n".join(render_kernels(report))
    assert "commit abc1234" in text
    # A published report names the library, never where it lay on the machine that measured it.
    assert "BLAS mkl from pypi: libmkl_rt.so.3 (LD_PRELOAD, INTEL threads)" in text
    assert "/work/" not in text
    assert "1.00, 2.00, 3.00 at the start" in text
    assert "1 thread(s)" in text
    # 1 MB in 0.1 ms is 10 GB/s; a missing combination is a dash; seconds past 0.1 s are written in seconds.
    assert "| 1000×1000 | 0.100 ms · 10.0 GB/s | 0.050 ms · 20.0 GB/s |" in text
    assert "| 2000×1000 | 2.50 s · 0.0 GB/s | – |" in text
    assert "**8 rows**" in text
    assert "| 1000×1000 | 0.200 ms · 5.0 GB/s | – |" in text
    # The largest error over the row counts, and bytes read / held of the largest matrix it ran.
    assert "| int8 | 2.00e-02 | 3.00e-02 | 2.00 MB / 2.00 MB |" in text
    assert "| int8, packed | 1.00e-02 | – | 1.00 MB / 5.00 MB |" in text
    assert "- Not measured: ggml: not built" in text


def test_time_call_repeats_fast_calls_and_times_a_slow_one_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    seconds, repeats = time_call(lambda: calls.append(1))
    assert repeats >= 3
    assert len(calls) == repeats + 1  # the warm-up is not timed
    assert seconds >= 0
    monkeypatch.setattr("bench.quant_kernels.SLOW_CALL_SECONDS", 0.0)
    calls.clear()
    _, repeats = time_call(lambda: calls.append(1))
    assert (repeats, len(calls)) == (1, 1)


def test_the_exo_rows_candidate_computes_ggmls_product() -> None:
    """The kernel bench's `exo rows` candidate (a graph of one custom node, built once and run again) gives ggml's
    product on the same Q5_0 blocks, run after run."""
    folder = find_ggml_library()
    if folder is None:
        skip_for_machine(ggml_missing_reason())
    ggml = ggml_library(folder)
    kernel = rows_kernel(folder)
    if kernel is None:
        skip_for_machine(rows_kernel_missing_reason(folder) or "no exo multi-row kernel")
    generator = np.random.default_rng(3)
    weights = (generator.standard_normal((200, 256)) * 0.05).astype(np.float32)
    ours = RowsProduct.create(ggml, kernel, weights, type_name="Q5_0", rows=8, threads=2)
    theirs = GgmlProduct.create(ggml, weights, "Q5_0", 8, 2)
    try:
        for _ in range(2):
            x = generator.standard_normal((8, 256)).astype(np.float32)
            expected = theirs.run(x)
            assert np.abs(ours.run(x) - expected).max() < 1e-5 * np.abs(expected).max()
        with pytest.raises(ValueError, match="takes 8 rows"):
            ours.run(np.zeros((4, 256), dtype=np.float32))
    finally:
        ours.close()
        theirs.close()


def test_q4_k_is_also_measured_held_as_llama_cpp_and_the_engine_hold_it() -> None:
    """Q4_K's candidates include ggml's product over the interleaved layout (llama.cpp's and the engine's) and, where
    the kernel takes it, exo's over the same layout: the repacked product is the stored one's, exo's within the
    rounding its per-32-value rows part from ggml's per-256 ones."""
    ggml, kernel, generator, weights, names = _ggml_candidates(seed=5)
    if "ggml Q4_K repacked" not in names:
        skip_for_machine("ggml holds no interleaved Q4_K on this CPU")
    takes_repacked = kernel is not None and kernel.fewest_rows(GGML_TYPES["Q4_K"], 512) > 0
    assert ("exo rows Q4_K repacked" in names) == takes_repacked
    stored = GgmlProduct.create(ggml, weights, "Q4_K", 4, 2)
    repacked = GgmlProduct.create(ggml, weights, "Q4_K", 4, 2, repacked=True)
    try:
        x = generator.standard_normal((4, 512)).astype(np.float32)
        expected = stored.run(x)
        scale = float(np.abs(expected).max())
        assert float(np.abs(repacked.run(x) - expected).max()) < 1e-4 * scale
        if kernel is not None and takes_repacked:
            ours = RowsProduct.create(ggml, kernel, weights, type_name="Q4_K", rows=4, threads=2, repacked=True)
            try:
                assert float(np.abs(ours.run(x) - expected).max()) < 0.08 * scale
            finally:
                ours.close()
    finally:
        stored.close()
        repacked.close()


def test_q6_k_is_also_measured_packed_as_the_engine_holds_it() -> None:
    """Where the kernel packs Q6_K (AVX-512 VNNI), its candidates include exo's product over the packed layout, the
    stored-layout kernel's product exactly where that one takes the rows (the same sums in the same order)."""
    ggml, kernel, generator, weights, names = _ggml_candidates(seed=6)
    packs = kernel is not None and kernel.packs("Q6_K", 64, 512)
    assert ("exo rows Q6_K packed" in names) == packs
    if kernel is None or not packs:
        skip_for_machine("exo packs Q6_K with AVX-512 VNNI only")
    stored = RowsProduct.create(ggml, kernel, weights, type_name="Q6_K", rows=4, threads=2)
    packed = RowsProduct.create(ggml, kernel, weights, type_name="Q6_K", rows=4, threads=2, packed=True)
    try:
        x = generator.standard_normal((4, 512)).astype(np.float32)
        assert np.array_equal(packed.run(x), stored.run(x))
        assert packed.weight_bytes == stored.weight_bytes  # the same bytes, rearranged
    finally:
        stored.close()
        packed.close()


def _ggml_candidates(
    seed: int,
) -> tuple[Ggml, RowsKernel | None, np.random.Generator, npt.NDArray[np.float32], list[str]]:
    """The ggml build and exo's kernel beside it (skipped without ggml), a seeded generator, a 64 × 512 matrix of
    its Gaussian weights and the names of the bench's candidates for it over 4 rows."""
    folder = find_ggml_library()
    if folder is None:
        skip_for_machine(ggml_missing_reason())
    ggml = ggml_library(folder)
    kernel = rows_kernel(folder)
    generator = np.random.default_rng(seed)
    weights = (generator.standard_normal((64, 512)) * 0.05).astype(np.float32)
    names: list[str] = []
    for candidate in _candidates(weights, 4, None, ggml, 2, rows_kernel=kernel):
        names.append(candidate.name)
        candidate.close()  # each holds its matrix and ggml's thread pool
    return ggml, kernel, generator, weights, names
