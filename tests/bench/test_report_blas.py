"""Section 6 renders one row per BLAS candidate, marks exo's choice and compares it with the reference."""

from bench.report_blas import BLAS_TITLE, render_blas
from bench.results import BlasMeasurement, BlasRow, BlasSection


def _run(gflops: float, prefill: float | None, decode: float | None) -> BlasMeasurement:
    return BlasMeasurement(
        library=None,
        self_check_gflops=gflops,
        sustained_gflops=gflops / 2,
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=decode,
    )


def _row(name: str, gflops: float, prefill: float, decode: float, *, chosen: bool = False) -> BlasRow:
    quiet = [_run(gflops, prefill, decode), _run(gflops * 0.8, prefill * 0.9, decode * 0.9)]
    return BlasRow(candidate=name, chosen_by_exo=chosen, quiet=quiet, contended=[_run(gflops / 4, None, None)])


def test_rows_marks_and_summary() -> None:
    section = BlasSection(
        rows=[
            _row("mlx's bundled reference BLAS", 5.0, 4.0, 1.0),
            _row("PyPI mkl, INTEL threads", 130.0, 90.0, 5.0, chosen=True),
        ],
        rounds=2,
        model_id="test-model",
        prefill_tokens=256,
        decode_tokens=16,
        cpu="Test CPU (2 CPUs)",
        load_average=(1.0, 1.0, 1.0),
        exo_commit="abc1234",
    )

    text = "\n".join(render_blas(section))

    assert text.startswith(BLAS_TITLE)
    assert "| mlx's bundled reference BLAS | 5 | 2 | 1 | 3.8 | 0.95 |" in text
    assert "| **PyPI mkl, INTEL threads** | 130 | 58 | 16 | 85.5 | 4.75 |" in text
    assert "exo's choice here (in bold) is PyPI mkl, INTEL threads" in text
    assert "prefills 22× and decodes 5.0× as fast on test-model" in text
