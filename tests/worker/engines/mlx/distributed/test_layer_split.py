"""A model split over 2 or 3 local ranks computes exactly what it computes whole, each rank holding only its layers.

Real processes, a real ring on 127.0.0.1 and the fixture models: Qwen2 through mlx-lm's own pipeline, Llama through
the layer-range wrapper.
"""

import shutil
from pathlib import Path

import pytest

from exo.models.errors import ModelLoadError
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.distributed.layer_split import UnsplittableModelError, split_layers
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.worker.engines.mlx.distributed.ranks import local_peers, run_on_ranks
from tests.worker.engines.mlx.distributed.stages import greedy_alone, greedy_in_lockstep


@pytest.mark.parametrize(
    ("model", "layer_counts", "strategy"),
    [
        ("tiny-qwen-tools-deep", (1, 2, 1), "mlx-lm"),
        ("tiny-qwen-tools-deep", (3, 1), "mlx-lm"),
        ("tiny-llama31-tools", (1, 1), "layer-range"),
    ],
)
def test_a_split_model_computes_exactly_what_the_whole_model_computes(
    model: str, layer_counts: tuple[int, ...], strategy: str
) -> None:
    model_dir = FIXTURE_MODELS_DIR / model
    whole = greedy_alone(model_dir)
    whole_fingerprints = whole["fingerprints"]
    assert isinstance(whole_fingerprints, list)
    ranks = run_on_ranks(greedy_in_lockstep, model_dir, layer_counts)
    leader = ranks[0]
    assert isinstance(leader, dict)
    assert leader["strategy"] == strategy
    assert leader["logits"] == whole["logits"]  # bit for bit, every step
    for rank, result in enumerate(ranks):
        assert isinstance(result, dict)
        assert result["tokens"] == whole["tokens"], f"rank {rank} fed other tokens"
        # Rank 0 runs the last layers; each rank holds the weights of its own layers only.
        start = sum(layer_counts[rank + 1 :])
        assert result["held_layers"] == layer_counts[rank]
        assert result["fingerprints"] == whole_fingerprints[start : start + layer_counts[rank]]


def test_a_rank_loads_from_a_directory_holding_only_its_own_layer_files(tmp_path: Path) -> None:
    source = FIXTURE_MODELS_DIR / "tiny-qwen-tools-deep"
    partial = tmp_path / "partial"
    shutil.copytree(source, partial)
    # Rank 0 of a (1, 3) split runs layer 3 only: drop the files of layers 0-2.
    for number in (0, 1, 2):
        (partial / f"model-{number + 1:05d}-of-00005.safetensors").unlink()
    ranks = run_on_ranks(_load_report, partial, (1, 3), timeout=120)
    assert ranks[0] == "loaded"
    assert isinstance(ranks[1], str)
    assert "missing model-00001-of-00005.safetensors, model-00002-of-00005.safetensors" in ranks[1]


def _load_report(shard: ShardAssignment, model_dir: Path, group: object) -> str:
    import mlx.core as mx

    assert isinstance(group, mx.distributed.Group)
    try:
        load_model(model_dir, shard, group=group)
    except ModelLoadError as error:
        return str(error)
    return "loaded"


def test_a_pipeline_shard_without_its_ring_is_refused() -> None:
    peers = local_peers((1, 1))
    shard = ShardAssignment(rank=1, world_size=2, start_layer=0, end_layer=1, peers=peers)
    with pytest.raises(ModelLoadError, match="needs the ring group"):
        load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", shard)


def test_a_family_not_known_to_split_cleanly_is_refused_with_the_families_that_are() -> None:
    import mlx.core as mx
    from mlx_lm.utils import load_model as mlx_lm_load_model

    model, _ = mlx_lm_load_model(FIXTURE_MODELS_DIR / "tiny-llama31-tools", lazy=True)
    model.model_type = "gemma3_text"  # its layers pick their attention by their number in the list
    shard = ShardAssignment(rank=1, world_size=2, start_layer=0, end_layer=1, peers=local_peers((1, 1)))
    with pytest.raises(UnsplittableModelError, match=r"'gemma3_text' has no pipeline support.*llama"):
        split_layers(model, mx.distributed.init(), shard)
