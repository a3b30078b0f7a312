"""Markdown for `bench.quant_kernels`: one table per row count (time and GB/s per shape and candidate), then each
candidate's largest error and bytes per shape."""

from bench.markdown import markdown_table, without_directories
from bench.quant_kernels import KernelReport, KernelResult

Shape = tuple[int, int]


def _load(values: tuple[float, float, float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def _cell(result: KernelResult | None) -> str:
    if result is None:
        return "–"
    return f"{_time(result.seconds)} · {result.gigabytes_per_s:.1f} GB/s"


def _shape(shape: Shape) -> str:
    return f"{shape[0]}×{shape[1]}"


def _bytes(count: int) -> str:
    return f"{count / 1e6:.2f} MB"


def _error_row(name: str, shapes: list[Shape], results: list[KernelResult]) -> list[str]:
    """The candidate's largest error per shape (over row counts), and its bytes read / held for the first shape."""
    mine = [result for result in results if result.candidate == name]
    cells: list[str] = []
    for shape in shapes:
        errors = [result.max_relative_error for result in mine if (result.out_features, result.in_features) == shape]
        cells.append(f"{max(errors):.2e}" if errors else "–")
    largest = max(mine, key=lambda result: result.out_features * result.in_features)
    return [name, *cells, f"{_bytes(largest.weight_bytes)} / {_bytes(largest.stored_bytes)}"]


def render_kernels(report: KernelReport) -> list[str]:
    candidates = list(dict.fromkeys(result.candidate for result in report.results))
    shapes: list[Shape] = list(dict.fromkeys((result.out_features, result.in_features) for result in report.results))
    row_counts = list(dict.fromkeys(result.rows for result in report.results))
    found = {(r.candidate, (r.out_features, r.in_features), r.rows): r for r in report.results}
    lines = [
        f"Run: commit {report.commit}, {report.cpu}, {report.finished_utc}; load average (1, 5, 15 min) "
        f"{_load(report.load_before)} at the start, {_load(report.load_after)} at the end; {report.threads} thread(s); "
        f"BLAS {without_directories(report.blas)}; "
        f"command `{without_directories(report.command)}`.",
        "",
    ]
    for rows in row_counts:
        lines += [
            f"**{rows} row{'s' if rows > 1 else ''}** (median time per product · weight bytes read per second)",
            "",
        ]
        table = [[_shape(shape), *(_cell(found.get((name, shape, rows))) for name in candidates)] for shape in shapes]
        lines += markdown_table(["W (out×in)", *candidates], table)
    largest = max(shapes, key=lambda shape: shape[0] * shape[1])
    lines += [
        "**Largest error against the float32 product** (max |y − y₃₂| / max |y₃₂| over all row counts), and the "
        f"bytes of the largest matrix ({_shape(largest)}) each candidate reads per product / holds in memory",
        "",
    ]
    errors = [_error_row(name, shapes, report.results) for name in candidates]
    lines += markdown_table(["Candidate", *(_shape(shape) for shape in shapes), "bytes read / held"], errors)
    lines += [f"- Not measured: {name}: {why}" for name, why in report.unavailable.items()]
    return lines
