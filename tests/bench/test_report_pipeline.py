"""Section 8 renders one row per node count with medians and the per-hop cost against one node."""

from bench.report_pipeline import PIPELINE_TITLE, render_pipeline
from bench.results import PipelineRow, PipelineSection


def test_rows_medians_and_hop_cost() -> None:
    section = PipelineSection(
        rows=[
            PipelineRow(nodes=1, ttft_s=[0.30, 0.20, 0.25], ms_per_token=[50.0, 40.0, 45.0], completion_tokens=48),
            PipelineRow(nodes=2, ttft_s=[0.40, 0.35, 0.50], ms_per_token=[55.0, 60.0, 52.0], completion_tokens=48),
            PipelineRow(nodes=3, ttft_s=[0.60, 0.55, 0.70], ms_per_token=[70.0, 65.0, 66.0], completion_tokens=48),
        ],
        model_id="test-model",
        max_tokens=48,
        requests=3,
        load_average=(2.0, 1.5, 1.0),
        exo_commit="abc1234",
    )

    text = "\n".join(render_pipeline(section))

    assert text.startswith(PIPELINE_TITLE)
    assert "load average (1, 5, 15 min) at the end 2.00, 1.50, 1.00" in text
    assert "| 1 | 45.0 | 22.2 | 250 | – | 50.0, 40.0, 45.0 |" in text
    assert "| 2 | 55.0 | 18.2 | 400 | +10.0 | 55.0, 60.0, 52.0 |" in text
    assert "| 3 | 66.0 | 15.2 | 600 | +10.5 | 70.0, 65.0, 66.0 |" in text
