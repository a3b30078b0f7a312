"""bench.ggml_rows' report: each matrix and block type a row, each row count its time and time per row, and the
cost of 8 rows over 1."""

from bench.ggml_rows import ROWS, RowsTiming, render


def test_the_report_gives_time_per_row_and_eight_rows_over_one() -> None:
    timings = [
        RowsTiming(shape="output head", block_type="Q8_0", rows=rows, milliseconds=milliseconds)
        for rows, milliseconds in zip(ROWS, (5.0, 10.0, 14.0, 20.0), strict=True)
    ] + [RowsTiming(shape="MLP gate", block_type="Q5_0", rows=rows, milliseconds=0.1) for rows in ROWS]

    lines = render(timings).splitlines()

    assert (
        lines[2] == "| output head | Q8_0 | 5.000 (5.000) | 10.000 (5.000) | 14.000 (3.500) | 20.000 (2.500) | 4.00× |"
    )
    assert lines[3] == "| MLP gate | Q5_0 | 0.100 (0.100) | 0.100 (0.050) | 0.100 (0.025) | 0.100 (0.013) | 1.00× |"
    assert len(lines) == 4
