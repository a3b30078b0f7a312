"""`--cpu-weights auto` (the command line's default) in a runner and a node: where the CPU replacements apply and
ggml's CPU library is found, a model whose import kept its GGUF is held as that GGUF's blocks and any other as Q8_0
blocks; without ggml, float32, with a note naming the command that builds it; elsewhere (`--cpu-kernels off`) it
changes nothing. The report says the resolved format, and the memory held is what the footprint plans for `auto`.

The tests with ggml need its CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a
reason of the machine, a failure under EXO_STRICT_SKIPS=1 (CI builds the library first).
"""

import os
from pathlib import Path

import pytest

from exo.models.footprint import read_footprint
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.cpu.engine import held_bytes as loaded_held_bytes
from exo.worker.engines.mlx.cpu.weights_choice import auto_fallback_note, node_weights
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.worker.engines.mlx.cpu.gguf_export import export_fixture
from tests.worker.engines.mlx.cpu.platform_gate import require_linux_cpu

MODEL = FIXTURE_MODELS_DIR / "tiny-qwen-tools"
BUILD_COMMAND = "`uv run exo ggml build`"


@pytest.mark.usefixtures("ggml")
def test_with_ggml_a_model_without_a_kept_gguf_is_held_as_q8_0() -> None:
    require_linux_cpu()
    assert node_weights("auto", "auto") == "gguf_or_q8_0"
    assert auto_fallback_note("auto", "auto") is None
    kernels = CpuKernels("auto", weights="auto", model_path=MODEL)
    report = kernels.report()
    assert (report.weights, report.weights_setting, report.weights_note) == ("q8_0", "auto", None)
    states = {state.name: state.why_off for state in report.replacements}
    assert states["q8_0_weights"] is None
    assert states["float32"] == states["gguf_weights"] == "--cpu-weights auto (q8_0)"
    assert "Q8_0 weights (ggml)" in report.describe()
    loaded = exo_load_model(MODEL, ShardAssignment(), cpu_kernels=kernels)
    assert loaded.dtype == "q8_0"
    # The footprint plans `auto` as Q8_0 for this model (norms and biases held in float32 besides: within 2 %).
    planned = read_footprint(MODEL).total_bytes(weights="gguf_or_q8_0")
    assert planned == read_footprint(MODEL).total_bytes(weights="q8_0")
    assert abs(loaded_held_bytes(loaded.model) - planned) / planned < 0.02


@pytest.mark.usefixtures("ggml")
def test_with_ggml_a_model_with_a_kept_gguf_is_held_as_its_gguf_and_as_q8_0_once_the_file_changed(
    tmp_path: Path,
) -> None:
    require_linux_cpu()
    directory = export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    kernels = CpuKernels("auto", weights="auto", model_path=directory)
    assert (kernels.report().weights, kernels.report().weights_note) == ("gguf", None)
    assert "GGUF weights as stored (ggml)" in kernels.report().describe()
    loaded = exo_load_model(directory, ShardAssignment(), cpu_kernels=kernels)
    assert loaded.dtype == "gguf"
    footprint = read_footprint(directory)
    assert footprint.held_as("gguf_or_q8_0") == "gguf"
    assert loaded_held_bytes(loaded.model) == footprint.total_bytes(weights="gguf_or_q8_0")
    # A kept GGUF changed since the import counts as none: the runner holds Q8_0, and the footprint plans it so.
    kept = directory / "model.gguf"
    stat = kept.stat()
    os.utime(kept, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert CpuKernels("auto", weights="auto", model_path=directory).report().weights == "q8_0"
    assert read_footprint(directory).held_as("gguf_or_q8_0") == "q8_0"


def test_without_ggml_auto_holds_float32_and_says_once_how_to_turn_the_quantized_path_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_linux_cpu()
    monkeypatch.setenv("EXO_GGML_DIR", str(tmp_path))  # a folder without the libraries
    assert node_weights("auto", "auto") == "float32"
    note = auto_fallback_note("auto", "auto")
    assert note is not None
    assert note.startswith("quantized weights off (--cpu-weights auto holds float32)")
    assert BUILD_COMMAND in note
    kernels = CpuKernels("auto", weights="auto", model_path=MODEL)
    report = kernels.report()
    assert (report.weights, report.weights_setting, report.weights_note) == ("float32", "auto", note)
    assert report.describe().endswith(note)
    assert {state.name: state.why_off for state in report.replacements}["q8_0_weights"] == (
        "--cpu-weights auto (float32)"
    )
    assert exo_load_model(MODEL, ShardAssignment(), cpu_kernels=kernels).dtype == "float32"
    # An explicit format says nothing of the kind: float32 was asked for, q8_0 refuses to load (test_q8_layers).
    assert auto_fallback_note("float32", "auto") is None
    assert CpuKernels("auto", weights="float32", model_path=MODEL).report().weights_note is None


def test_under_cpu_kernels_off_auto_changes_nothing() -> None:
    """Stock mlx-lm serves the checkpoint as stored, with or without ggml, and says nothing of ggml."""
    assert node_weights("auto", "off") == "float32"
    assert auto_fallback_note("auto", "off") is None
    kernels = CpuKernels("off", weights="auto", model_path=MODEL)
    assert (kernels.report().weights, kernels.report().weights_note) == ("float32", None)
    assert exo_load_model(MODEL, ShardAssignment(), cpu_kernels=kernels).dtype == "native"
