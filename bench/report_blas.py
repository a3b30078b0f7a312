"""Render section 6, the BLAS candidates on Linux x86_64, as Markdown."""

from statistics import median

from bench.markdown import markdown_table
from bench.results import BlasMeasurement, BlasRow, BlasSection

BLAS_TITLE = "## 6. BLAS on Linux x86_64 without root"


def _median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return median(present) if present else None


def _number(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _prefill(measurements: list[BlasMeasurement]) -> float | None:
    return _median([measurement.prefill_tokens_per_s for measurement in measurements])


def _decode(measurements: list[BlasMeasurement]) -> float | None:
    return _median([measurement.decode_tokens_per_s for measurement in measurements])


def _row(row: BlasRow) -> list[str]:
    return [
        f"**{row.candidate}**" if row.chosen_by_exo else row.candidate,
        _number(max(measurement.self_check_gflops for measurement in row.quiet)),
        _number(_median([measurement.sustained_gflops for measurement in row.quiet])),
        _number(_median([measurement.sustained_gflops for measurement in row.contended])),
        _number(_prefill(row.quiet), 1),
        _number(_decode(row.quiet), 2),
    ]


def _summary(section: BlasSection) -> list[str]:
    reference = section.rows[0]
    chosen = next((row for row in section.rows if row.chosen_by_exo), None)
    if chosen is None:
        return []
    lines = [f"- exo's choice here (in bold) is {chosen.candidate}."]
    chosen_prefill, reference_prefill = _prefill(chosen.quiet), _prefill(reference.quiet)
    chosen_decode, reference_decode = _decode(chosen.quiet), _decode(reference.quiet)
    if chosen_prefill and reference_prefill and chosen_decode and reference_decode:
        lines.append(
            f"- Against mlx's reference BLAS it prefills {chosen_prefill / reference_prefill:.0f}× and decodes "
            f"{chosen_decode / reference_decode:.1f}× as fast on {section.model_id}."
        )
    return [*lines, ""]


def render_blas(section: BlasSection) -> list[str]:
    """The section's Markdown lines."""
    load = ", ".join(f"{value:.2f}" for value in section.load_average)
    header = [
        "Candidate",
        "Self-check GFLOP/s (best)",
        "Sustained GFLOP/s",
        "Sustained, 1 busy process competing",
        f"Prefill tok/s ({section.prefill_tokens} tokens)",
        f"Decode tok/s ({section.decode_tokens} tokens)",
    ]
    return [
        BLAS_TITLE,
        "",
        f"Measured at commit {section.exo_commit} on {section.cpu}; load average (1, 5, 15 min) at the end {load}.",
        "",
        "Each run is a fresh process with the candidate preloaded the way exo preloads its runner's BLAS; the "
        f"candidates take turns, {section.rounds} round(s). Self-check = exo's runner self-check (best single "
        "512×512 float32 matmul in 0.15 s, what `/state` shows); sustained = mean 512×512 matmul rate over 3 s; "
        "the next column repeats that while one busy-looping process competes for a core; prefill and decode run "
        f"{section.model_id or 'no model'} as exo's runner loads it (float32). Medians over the rounds.",
        "",
        *markdown_table(header, [_row(row) for row in section.rows]),
        *_summary(section),
    ]
