"""bench.report_split_link's extras table: each rank's planned memory and the weights its runner held, in the
unit that reads at its size; a run from before the bench read the weights shows n/a."""

from bench.report_split_link import ExtrasRow, Prefill, RankMemory, StreamsAtOnce, extras_table

STREAMS = StreamsAtOnce(streams=4, tokens=192, seconds=3.0, aggregate_tokens_per_s=64.0)
PREFILL = Prefill(prompt_tokens=[2137], ttft_s=[1.5], median_prompt_tokens_per_s=1424.7)


def _row(label: str, memory: list[RankMemory]) -> ExtrasRow:
    return ExtrasRow(extras=label, load_average=6.3, memory=memory, streams=STREAMS, prefill=PREFILL)


def test_the_weights_each_rank_held_are_shown_beside_the_plan() -> None:
    split = [
        RankMemory(rank=0, node="beta", planned_bytes=268_971_059, weights_bytes=487_936),
        RankMemory(rank=1, node="alpha", planned_bytes=268_971_059, weights_bytes=3 * 2**20),
    ]
    lines = extras_table([_row("2 nodes, tensor, +0 ms", split)])
    assert lines[0].endswith("| planned memory per rank (MiB) | weights held per rank | load |")
    assert (
        lines[2]
        == "| 2 nodes, tensor, +0 ms | 64.0 (192 tokens in 3.0 s) | 1425 | 2137 | 257, 257 | 476 KiB, 3.0 MiB | 6.3 |"
    )


def test_a_run_without_the_weights_shows_n_a() -> None:
    old = [RankMemory.model_validate({"rank": 0, "node": "alpha", "planned_bytes": 269_297_715})]
    lines = extras_table([_row("1 node (after the tensor split)", old)])
    assert "| 257 | n/a | 6.3 |" in lines[2]
