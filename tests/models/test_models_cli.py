"""`exo models` as a user runs it (a real process): the memory column is the weights' size as a node started with
the same `--cpu-kernels` and `--cpu-weights` on this machine holds them, the header names that format, and `--json`
carries the same figure."""

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import TypeAdapter
from rich.filesize import decimal

from exo.models.catalog import CATALOG
from exo.models.catalog_api import NodeCatalogModel
from exo.shared.local_backend import local_weights_in_memory
from exo.shared.types.footprint import held_as
from exo.worker.engines.mlx.cpu.weights_choice import node_weights

pytestmark = pytest.mark.slow  # a process per call: about 6 s each

_MODELS = TypeAdapter(list[NodeCatalogModel])


def _exo_models(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "exo", "models", "--models-dir", str(tmp_path), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.parametrize(
    "arguments", [(), ("--cpu-weights", "int8"), ("--cpu-kernels", "off", "--cpu-weights", "int8")], ids=str
)
def test_the_memory_column_is_for_the_weights_format_the_node_would_hold(
    tmp_path: Path, arguments: tuple[str, ...]
) -> None:
    kernels = "off" if "off" in arguments else "auto"
    # No --cpu-weights is `auto`: every catalog import keeps its GGUF, so gguf where ggml is built, else float32.
    node = node_weights("int8" if "int8" in arguments else "auto", kernels)
    weights = held_as(local_weights_in_memory(kernels, node), gguf_kept=True)
    shown = _exo_models(tmp_path, *arguments)
    header, *rows = shown.stdout.splitlines()
    cells = [[cell for cell in row.split("  ") if cell] for row in rows]
    headers = [cell for cell in header.split("  ") if cell]
    column = headers.index(f"MEMORY ({weights.upper()})")
    assert [row[0].strip() for row in cells] == [entry.model_id for entry in CATALOG]
    assert [row[column].strip() for row in cells] == [decimal(entry.memory_bytes(weights)) for entry in CATALOG]
    label = "stored weights" if weights == "stored" else weights
    assert f"memory is the weights held as {label}" in shown.stderr

    listed = _MODELS.validate_json(_exo_models(tmp_path, "--json", *arguments).stdout)
    assert [(model.weights_in_memory, model.memory_bytes) for model in listed] == [
        (weights, entry.memory_bytes(weights)) for entry in CATALOG
    ]


@pytest.mark.skipif(local_weights_in_memory() == "stored", reason="the CPU engine converts weights on a CPU only")
def test_on_a_linux_cpu_int8_shows_about_a_quarter_of_float32(tmp_path: Path) -> None:
    float32 = _MODELS.validate_json(_exo_models(tmp_path, "--json", "--cpu-weights", "float32").stdout)
    int8 = _MODELS.validate_json(_exo_models(tmp_path, "--json", "--cpu-weights", "int8").stdout)
    for wide, narrow in zip(float32, int8, strict=True):
        assert 3.8 < wide.memory_bytes / narrow.memory_bytes < 4.0
