"""GGUF weights inside an mlx model (`--cpu-weights gguf`): each stored type's ggml product agrees with the product
by the gguf-dequantized matrix, an embedding lookup reads its blocks back, a fixture model exported to a GGUF answers
its trained prompts from the file's own blocks without ever evaluating a float copy of a matrix, its memory is the
file's tensor bytes, and a model without a kept GGUF is refused naming how to import it again.

Tolerance of a product: the matrix is exactly the dequantized GGUF tensor (the blocks are served as stored), so only
ggml's rounding of the activations to its dot-product type differs from the float32 product: Q8_0 blocks of 32
(the legacy types), Q8_K blocks of 256 (the K-quants), float16 (F16) or bfloat16 (BF16), within 2 % of the output's
largest magnitude (as Q8_0's tests; the activations' 8-bit steps are under 0.4 % of a block's largest value).

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a reason of
the machine, a failure under EXO_STRICT_SKIPS=1 (CI builds the library first).
"""

import os
from pathlib import Path
from typing import cast

import gguf
import mlx.core as mx
import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType
from mlx import nn

from exo.models.errors import ModelLoadError
from exo.models.footprint import read_footprint
from exo.models.gguf_import import tensor_record
from exo.models.gguf_source import GgufTensor, gguf_missing_reason, kept_gguf, read_gguf_source
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.model_identity import model_identity
from exo.worker.engines.mlx.cpu.embedding_rows import FileRows, HeldRows
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.cpu.engine import held_bytes as loaded_held_bytes
from exo.worker.engines.mlx.cpu.ggml_library import CACHED_ROWS, Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.gguf_layers import (
    FileEmbedding,
    GgufEmbedding,
    GgufModelSource,
    file_embedding_bytes,
    gguf_matrix,
)
from exo.worker.engines.mlx.cpu.q8_layers import Q8Linear, Q8Weights, SwiGluMlp, q8_bytes
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, FixtureModelName
from tests.fixtures.model_builder.verify import load_model
from tests.worker.engines.mlx.cpu.gguf_export import export_fixture, export_untied
from tests.worker.engines.mlx.cpu.platform_gate import require_linux_cpu
from tests.worker.engines.mlx.cpu.weight_formats import fixture_matrix, mismatched_trained_cases, relative_error

TOLERANCE = 0.02
PACKAGE_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
"""Types gguf's own quantizer writes."""
GGML_QUANTIZED_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""K-quants, which gguf's package cannot quantize: their blocks come from ggml's own quantizer (llama.cpp's)."""


def _stored_tensor(
    ggml: Ggml, type_name: str, weight: npt.NDArray[np.float32], folder: Path
) -> tuple[gguf.ReaderTensor, GgufTensor, Path]:
    """`weight` written as one `type_name` tensor of a GGUF in `folder` and read back as a runner reads it; the
    tensor as gguf reads it, as the import records it, and the file."""
    qtype = GGMLQuantizationType[type_name]
    if type_name in GGML_QUANTIZED_TYPES:
        made = GgmlMatrix(ggml, type_name, weight.shape[0], weight.shape[1])
        made.fill(0, weight)
        blocks = made.blocks.copy()
    else:
        blocks = gguf.quants.quantize(weight, qtype)
    path = folder / f"{type_name}.gguf"
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_tensor("blk.0.ffn_down.weight", blocks, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tensor,) = gguf.GGUFReader(path, "r").tensors
    assert tensor.tensor_type == qtype
    return tensor, tensor_record(tensor), path


@pytest.mark.parametrize("type_name", [*PACKAGE_TYPES, *GGML_QUANTIZED_TYPES])
def test_each_stored_type_multiplies_as_its_dequantized_matrix(ggml: Ggml, type_name: str, tmp_path: Path) -> None:
    """Row counts of a decode step (1), of batched decoding (2-8, graphs kept) and of a prefill chunk (a graph per
    call), on a real trained matrix (64 x 128) beside itself reversed: 256-value rows, whole blocks of every type."""
    trained = np.asarray(fixture_matrix())
    weight = np.ascontiguousarray(np.concatenate([trained, trained[:, ::-1]], axis=1))
    tensor, record, path = _stored_tensor(ggml, type_name, weight, tmp_path)
    dequantized: npt.NDArray[np.float32] = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    matrix = gguf_matrix(record, path, ggml)
    assert matrix.shape == weight.shape
    assert matrix.nbytes == int(tensor.n_bytes)
    np.testing.assert_array_equal(matrix.blocks.reshape(-1), np.asarray(tensor.data).view(np.uint8).reshape(-1))
    layer = Q8Linear(Q8Weights(matrix), None)
    for rows in (1, 2, 5, 8, CACHED_ROWS + 1, 512):
        x = mx.random.normal((1, rows, weight.shape[1]), key=mx.random.key(rows))
        reference = mx.array(np.asarray(x) @ dequantized.T)
        result = layer(x)
        assert result.shape == reference.shape
        assert relative_error(result, reference) < TOLERANCE, (type_name, rows)


def test_a_gguf_embedding_looks_up_the_dequantized_rows_and_projects_by_its_blocks(ggml: Ggml, tmp_path: Path) -> None:
    table = np.asarray(mx.random.normal((50, 256), key=mx.random.key(5)))
    tensor, record, path = _stored_tensor(ggml, "Q5_0", table, tmp_path)
    embedding = GgufEmbedding(Q8Weights(gguf_matrix(record, path, ggml)), tensor.tensor_type)
    dequantized: npt.NDArray[np.float32] = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    ids = mx.array([[3, 7, 7, 49]])
    looked_up = embedding(ids)
    assert looked_up.shape == (1, 4, 256)
    assert looked_up.dtype == mx.float32
    np.testing.assert_array_equal(np.asarray(looked_up)[0], dequantized[[3, 7, 7, 49]])
    x = mx.random.normal((1, 2, 256), key=mx.random.key(6))
    assert relative_error(embedding.as_linear(x), mx.array(np.asarray(x) @ dequantized.T)) < TOLERANCE


@pytest.mark.parametrize("type_name", ["Q5_0", "Q8_0", "Q4_K"])
def test_rows_read_from_the_file_are_the_held_matrixs_rows(ggml: Ggml, type_name: str, tmp_path: Path) -> None:
    table = np.asarray(mx.random.normal((40, 256), key=mx.random.key(8)))
    tensor, record, path = _stored_tensor(ggml, type_name, table, tmp_path)
    held = HeldRows(gguf_matrix(record, path, ggml))
    in_features, out_features = record.shape
    from_file = FileRows(path, record.offset, record.type, (out_features, in_features), held.row_bytes)
    ids = np.array([0, 39, 7, 7, 12], dtype=np.int64)
    expected = np.asarray(tensor.data).view(np.uint8).reshape(out_features, -1)[ids]
    for rows in (held, from_file):
        np.testing.assert_array_equal(rows.take(ids), expected)
        written = np.zeros((len(ids), held.row_bytes), dtype=np.uint8)
        rows.read_into([int(token) for token in ids], written.ctypes.data)
        np.testing.assert_array_equal(written, expected)
    with pytest.raises(IndexError, match="outside the embedding table's 40 rows"):
        from_file.take(np.array([40], dtype=np.int64))
    with pytest.raises(ValueError, match="ends before"):
        FileRows(path, record.offset + 1, record.type, (out_features, in_features), held.row_bytes)


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_an_untied_models_embedding_is_looked_up_in_its_file_not_held(name: FixtureModelName, tmp_path: Path) -> None:
    """With an output head of its own (as the default model has), the embedding table is only looked up: its rows
    are read from the GGUF, no matrix of it is held, and the model still answers its trained prompts."""
    require_linux_cpu()
    directory = export_untied(name, tmp_path / name)
    model = exo_load_model(directory, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights="gguf")).model
    embedding = model["model"]["embed_tokens"]
    assert isinstance(embedding, FileEmbedding)
    source = read_gguf_source(directory)
    assert source is not None
    table = source.tensors["model.embed_tokens.weight"].nbytes
    vectors = sum(size for name, size in source.tensor_bytes.items() if "norm" in name or name.endswith(".bias"))
    # No block of the table is held: the held matrices are the file's others. It still counts among the weights
    # the runner serves (`held_bytes`, which placement plans from the file's tensors).
    assert q8_bytes(model) == sum(source.tensor_bytes.values()) - vectors - table
    assert file_embedding_bytes(model) == table
    assert loaded_held_bytes(model) == sum(source.tensor_bytes.values())
    assert mismatched_trained_cases(name, "gguf", directory) == []


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_fixture_model_exported_to_gguf_answers_its_trained_prompts_from_its_blocks(
    name: FixtureModelName, tmp_path: Path
) -> None:
    """Q8_0, F16 and BF16 tensors; the llama fixture's q/k rows stored in llama.cpp's interleaved order."""
    require_linux_cpu()
    assert mismatched_trained_cases(name, "gguf", export_fixture(name, tmp_path / name)) == []


@pytest.mark.usefixtures("ggml")
def test_no_float_copy_of_a_served_matrix_is_evaluated_and_memory_is_the_files_tensors(tmp_path: Path) -> None:
    """The model is built lazily and its matrices replaced unread: mlx only ever allocates the norms (and a
    forward pass's activations), never the float16 matrices of the import; what the model holds is what the
    footprint plans under gguf, the GGUF's tensor bytes exactly."""
    require_linux_cpu()
    directory = export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    source = read_gguf_source(directory)
    assert source is not None
    imported = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools").model
    matrices = sum(
        module["weight"].size for _, module in imported.named_modules() if isinstance(module, (nn.Linear, nn.Embedding))
    )
    del imported
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    loaded = exo_load_model(directory, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights="gguf"))
    peak = mx.get_peak_memory() - before
    # One float16 copy of the matrices would take 2 bytes a weight; the norms alone are a few kilobytes.
    assert peak < matrices * 2 / 10, (peak, matrices)
    assert not [name for name, module in loaded.model.named_modules() if isinstance(module, (nn.Linear, nn.Embedding))]
    # Each layer's MLP is one ggml graph in decode steps, as under q8_0 (test_fused_mlp.py).
    fused = [module for _, module in loaded.model.named_modules() if isinstance(module, SwiGluMlp)]
    assert len(fused) == len(cast(list[nn.Module], loaded.model["model"]["layers"]))
    footprint = read_footprint(directory)
    planned = footprint.total_bytes(weights="gguf")
    assert planned == sum(source.tensor_bytes.values())
    assert loaded_held_bytes(loaded.model) == planned
    vectors = sum(size for name, size in source.tensor_bytes.items() if "norm" in name or name.endswith(".bias"))
    assert q8_bytes(loaded.model) == planned - vectors
    # The float16 import's files are what float32 is planned from, not what gguf holds.
    assert planned < footprint.total_bytes(weights="stored") / 1.5


def test_a_model_without_a_kept_gguf_is_refused_naming_how_to_import_it_again(ggml: Ggml, tmp_path: Path) -> None:
    """Not served from its float16 import instead: the node planned memory for the GGUF's blocks."""
    require_linux_cpu()
    del ggml
    kernels = CpuKernels("auto", weights="gguf")
    plain = FIXTURE_MODELS_DIR / "tiny-qwen-tools"
    with pytest.raises(ModelLoadError, match=rf"--cpu-weights gguf .* remove {plain} and start exo with the .gguf"):
        exo_load_model(plain, ShardAssignment(), cpu_kernels=kernels)
    catalog = Path("/models/qwen2.5-coder-0.5b-instruct")
    assert gguf_missing_reason(catalog, ("qwen2.5-coder-0.5b-instruct",)).endswith(
        "`exo models download qwen2.5-coder-0.5b-instruct --force`"
    )
    # A kept GGUF changed since the import (its time, here) counts as none.
    directory = export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    kept = kept_gguf(directory)
    assert kept is not None
    assert kept == directory / "model.gguf"
    stat = kept.stat()
    os.utime(kept, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert kept_gguf(directory) is None
    with pytest.raises(ModelLoadError, match="is gone or changed since the import"):
        exo_load_model(directory, ShardAssignment(), cpu_kernels=kernels)


def test_without_the_ggml_library_gguf_refuses_to_load_naming_the_build_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_linux_cpu()
    monkeypatch.setenv("EXO_GGML_DIR", str(tmp_path))  # a folder without the libraries
    kernels = CpuKernels("auto", weights="gguf")
    states = {state.name: state.why_off for state in kernels.report().replacements}
    assert states["gguf_weights"] == "no ggml library"
    assert states["q8_0_weights"] == "--cpu-weights gguf"
    with pytest.raises(ModelLoadError, match=r"--cpu-weights gguf needs ggml's CPU library.*exo ggml build"):
        exo_load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment(), cpu_kernels=kernels)


def test_the_runner_report_names_gguf_weights(ggml: Ggml) -> None:
    require_linux_cpu()
    kernels = CpuKernels("auto", weights="gguf")
    states = {state.name: state for state in kernels.report().replacements}
    assert states["gguf_weights"].on
    assert cast(str, states["float32"].why_off) == "--cpu-weights gguf"
    assert states["q8_0_weights"].why_off == "--cpu-weights gguf"
    assert "GGUF weights as stored (ggml)" in kernels.report().describe()
    assert kernels.ggml_dir == ggml.library_dir
    assert kernels.loads_lazily


def test_a_disk_snapshots_model_identity_records_the_gguf_format_and_file(tmp_path: Path) -> None:
    directory = export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    identities = {fmt: model_identity(directory, ShardAssignment(), fmt) for fmt in ("float32", "q8_0", "gguf")}
    assert len(set(identities.values())) == 3
    kept = directory / "model.gguf"
    stat = kept.stat()
    os.utime(kept, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    source = read_gguf_source(directory)
    assert source is not None
    (directory / "gguf-source.json").write_text(
        source.model_copy(update={"mtime_ns": kept.stat().st_mtime_ns}).model_dump_json()
    )
    assert model_identity(directory, ShardAssignment(), "gguf") != identities["gguf"]
    assert model_identity(directory, ShardAssignment(), "float32") == identities["float32"]


def test_a_pipeline_stage_finds_its_layers_and_wrapped_embedding_in_the_gguf(tmp_path: Path) -> None:
    """A layer-range stage numbers its kept layers from 0 and wraps a later stage's embedding; mlx-lm's own
    pipeline keeps the layers' numbers (first_layer 0)."""
    directory = export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    kept, source = kept_gguf(directory), read_gguf_source(directory)
    assert kept is not None
    assert source is not None
    stage = GgufModelSource(directory, kept, source, first_layer=1)
    assert _name(stage.tensor("model.layers.0.mlp.up_proj")) == "blk.1.ffn_up.weight"
    assert _name(stage.tensor("model.embed_tokens.embedding")) == "token_embd.weight"
    assert stage.tensor("model.layers.1.mlp.up_proj") is None  # the model has layers 0 and 1 only
    whole = GgufModelSource(directory, kept, source)
    assert _name(whole.tensor("model.layers.1.self_attn.q_proj")) == "blk.1.attn_q.weight"
    assert whole.rotary_heads("model.layers.1.self_attn.q_proj") is None  # qwen2 stores rows as mlx-lm does


def _name(tensor: GgufTensor | None) -> str | None:
    return None if tensor is None else tensor.name


@pytest.mark.usefixtures("ggml")
def test_sibling_gguf_layers_share_one_graph_as_under_q8_0(tmp_path: Path) -> None:
    """q/k/v (Q8_0 here) and gate/up grouped in every layer; o_proj (F16) and down_proj (BF16) alone."""
    require_linux_cpu()
    directory = export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    loaded = exo_load_model(directory, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights="gguf"))
    grouped = sorted(
        name.rsplit(".", 1)[-1]
        for name, module in loaded.model.named_modules()
        if isinstance(module, Q8Linear) and module.shared is not None
    )
    assert grouped == sorted(["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"] * 2)
