"""`--cpu-weights auto` resolved: on a node, the quantized path where the CPU replacements apply and ggml's library
is found, else float32; for one model, its kept GGUF, else Q8_0; and the memory every figure reports (footprint,
catalog) follows the resolved format, never `auto` itself."""

import pytest

from exo.models.catalog import CATALOG
from exo.shared.types.cpu_kernels import CpuWeightsSetting, NodeCpuWeights, resolve_model_weights, resolve_node_weights
from exo.shared.types.footprint import ModelFootprint, held_as, weights_in_memory

FOOTPRINT = ModelFootprint(
    layer_parameters=(100_000_000,) * 4,
    shared_parameters=50_000_000,
    layer_file_bytes=(200_000_000,) * 4,
    shared_file_bytes=100_000_000,
)
KEPT = FOOTPRINT.model_copy(update={"layer_gguf_bytes": (60_000_000,) * 4, "shared_gguf_bytes": 30_000_000})


@pytest.mark.parametrize(
    ("applies", "ggml_found", "expected"),
    [(True, True, "gguf_or_q8_0"), (True, False, "float32"), (False, True, "float32"), (False, False, "float32")],
)
def test_auto_is_the_quantized_path_only_where_it_applies_and_ggml_is_found(
    applies: bool, ggml_found: bool, expected: NodeCpuWeights
) -> None:
    assert resolve_node_weights("auto", applies=applies, ggml_found=ggml_found) == expected


@pytest.mark.parametrize("setting", ["float32", "int8", "q8_0", "gguf"])
def test_an_explicit_format_is_kept_whether_or_not_ggml_is_found(setting: CpuWeightsSetting) -> None:
    for applies in (True, False):
        for ggml_found in (True, False):
            assert resolve_node_weights(setting, applies=applies, ggml_found=ggml_found) == setting


def test_a_model_is_held_as_its_kept_gguf_else_as_q8_0() -> None:
    assert resolve_model_weights("gguf_or_q8_0", gguf_kept=True) == "gguf"
    assert resolve_model_weights("gguf_or_q8_0", gguf_kept=False) == "q8_0"
    assert resolve_model_weights("float32", gguf_kept=True) == "float32"
    assert held_as("gguf_or_q8_0", gguf_kept=True) == "gguf"
    assert held_as("gguf_or_q8_0", gguf_kept=False) == "q8_0"
    assert held_as("stored", gguf_kept=True) == "stored"


def test_the_footprint_of_auto_is_the_resolved_formats() -> None:
    """A model without a kept GGUF is planned at Q8_0's 34 bytes per 32 weights; one with, at its GGUF's tensor
    bytes; a tensor rank as under the resolved format."""
    assert FOOTPRINT.held_as("gguf_or_q8_0") == "q8_0"
    assert KEPT.held_as("gguf_or_q8_0") == "gguf"
    assert FOOTPRINT.total_bytes(weights="gguf_or_q8_0") == int(450_000_000 * 34 / 32)
    assert FOOTPRINT.rank_bytes(2, 4, weights="gguf_or_q8_0") == FOOTPRINT.rank_bytes(2, 4, weights="q8_0")
    assert KEPT.total_bytes(weights="gguf_or_q8_0") == 30_000_000 + 4 * 60_000_000
    assert KEPT.rank_bytes(0, 2, weights="gguf_or_q8_0") == KEPT.rank_bytes(0, 2, weights="gguf")
    assert KEPT.tensor_rank_bytes(2, weights="gguf_or_q8_0") == KEPT.tensor_rank_bytes(2, weights="gguf")
    assert FOOTPRINT.tensor_rank_bytes(2, weights="gguf_or_q8_0") == FOOTPRINT.tensor_rank_bytes(2, weights="q8_0")


def test_auto_changes_nothing_off_a_cpu_or_under_cpu_kernels_off() -> None:
    assert weights_in_memory("cpu", "auto", "gguf_or_q8_0") == "gguf_or_q8_0"
    assert weights_in_memory("metal", "auto", "gguf_or_q8_0") == "stored"
    assert weights_in_memory("cpu", "off", "float32") == "stored"


def test_the_catalog_shows_auto_as_the_gguf_every_catalog_import_keeps() -> None:
    for entry in CATALOG:
        assert entry.memory_bytes("gguf_or_q8_0") == entry.memory_bytes("gguf") == entry.source.gguf_size
