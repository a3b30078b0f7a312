"""A fixture model exported to a GGUF and kept beside it, as an import from a GGUF keeps its file: what
`--cpu-weights gguf` serves (tests/models/tiny_gguf.py writes GGUFs the same way, with llama.cpp's names and its
llama q/k row order)."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import cast

import gguf
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType

from bench.random_model import ReducedShape, write_random_model
from exo.models.gguf_import import gguf_tensors, tensor_record
from exo.models.gguf_source import record_gguf
from exo.worker.engines.mlx.cpu.ggml_library import Ggml, GgmlMatrix
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, FixtureModelName
from tests.models.tiny_gguf import gguf_name, permute_rotary

MATRIX_TYPES: dict[str, GGMLQuantizationType] = {
    "attn_output.weight": GGMLQuantizationType.F16,
    "ffn_down.weight": GGMLQuantizationType.BF16,
}
"""Each 2-D tensor's type by its GGUF name's end; the others Q8_0 (the trained prompts' margins hold under these)."""

Quantizer = Callable[[npt.NDArray[np.float32], GGMLQuantizationType], npt.NDArray[np.uint8]]


def export_fixture(name: FixtureModelName, target: Path) -> Path:
    """A copy of fixture model `name` at `target` with its weights also written as a GGUF kept beside them (matrices
    Q8_0, F16 or BF16 per MATRIX_TYPES, vectors F32); returns `target`."""
    return export_model(FIXTURE_MODELS_DIR / name, target)


def export_untied(name: FixtureModelName, target: Path) -> Path:
    """`export_fixture` of fixture model `name` made untied, as the default model is: an output head of its own
    (`lm_head`, the GGUF's `output.weight`: a copy of the embedding table, so its answers are the fixture's), so its
    embedding table is only looked up."""
    untied = target.parent / f"{name}-untied-source"
    shutil.copytree(FIXTURE_MODELS_DIR / name, untied)
    config = json.loads((untied / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (untied / "config.json").write_text(json.dumps(config))
    weights = cast(dict[str, mx.array], mx.load(str(untied / "model.safetensors")))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    mx.save_safetensors(str(untied / "model.safetensors"), weights, metadata={"format": "mlx"})
    return export_model(untied, target)


def export_wide(ggml: Ggml, directory: Path, type_name: str) -> Path:
    """A random model wide enough for the K-quants' 256-value blocks (tiny-qwen-tools' tokenizer, two layers of 256),
    exported with every matrix in `type_name` (Q4_K, Q6_K: quantized by ggml itself, as llama.cpp's quantizer does)
    into `directory`."""
    wide = directory / "wide"
    shape = ReducedShape(layers=2, hidden_size=256, intermediate_size=512, attention_heads=4, key_value_heads=2)
    write_random_model(fixture_model("tiny-qwen-tools"), wide, "float32", shape)
    kind = GGMLQuantizationType[type_name]

    def quantize(values: npt.NDArray[np.float32], qtype: GGMLQuantizationType) -> npt.NDArray[np.uint8]:
        if qtype != kind:
            return gguf.quants.quantize(values, qtype)
        matrix = GgmlMatrix(ggml, type_name, *values.shape)
        matrix.fill(0, values.astype(np.float32))
        return matrix.blocks.copy()

    return export_model(wide, directory / "exported", quantize, {"weight": kind})


def export_model(
    source: Path,
    target: Path,
    quantize: Quantizer | None = None,
    matrix_types: dict[str, GGMLQuantizationType] | None = None,
) -> Path:
    """`export_fixture` for any model directory `source` (`quantize`: for the block types gguf's own Python does not
    quantize, such as the K-quants: values and type to the blocks; `matrix_types`: in place of `MATRIX_TYPES`)."""
    types = MATRIX_TYPES if matrix_types is None else matrix_types
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    architecture = str(config["model_type"])
    weights = cast(dict[str, mx.array], mx.load(str(target / "model.safetensors")))
    path = target.parent / f"{source.name}.gguf"
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config["num_key_value_heads"]))
    for hf_name, value in sorted(weights.items()):
        values = np.asarray(value.astype(mx.float32))
        if architecture == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = "num_attention_heads" if "q_proj" in hf_name else "num_key_value_heads"
            values = permute_rotary(values, int(config[heads]))
        tensor = gguf_name(hf_name)
        qtype = GGMLQuantizationType.F32
        if values.ndim == 2:
            qtype = next((kind for suffix, kind in types.items() if tensor.endswith(suffix)), GGMLQuantizationType.Q8_0)
        blocks = quantize(values, qtype) if quantize is not None else gguf.quants.quantize(values, qtype)
        writer.add_tensor(tensor, blocks, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensors = {hf: tensor_record(tensor) for hf, tensor in gguf_tensors(gguf.GGUFReader(path, "r")).items()}
    record_gguf(target, path, tensors, move=True)
    return target
