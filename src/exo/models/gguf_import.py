"""Convert a GGUF checkpoint (qwen2 or llama architecture) into a directory that `mlx_lm.load` accepts.

Every tensor is dequantized with `gguf.quants.dequantize` (numpy, matches llama.cpp) rather than `mx.load`,
which decodes Q4_K wrongly and cannot read Q5_0/Q6_K. Weights are written as float16 safetensors. The GGUF itself is
kept beside them (`gguf_source.py`) for `--cpu-weights gguf`, which serves its blocks as they are.
"""

import json
import logging
import re
import time
from pathlib import Path
from typing import TypeVar

import gguf
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel
from safetensors.numpy import save_file

from exo.models.errors import ModelLoadError
from exo.models.gguf_metadata import GGUFMetadata
from exo.models.gguf_source import GgufTensor, record_gguf
from exo.models.gguf_tokenizer import build_tokenizer, find_untrained_markers
from exo.models.progress import ByteCounter, ProgressCallback, no_progress
from exo.models.staging import staged_directory

logger = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("qwen2", "llama")
_Value = TypeVar("_Value", bound=np.generic)

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TENSOR_NAME = re.compile(r"^(?:blk\.(?P<layer>\d+)\.)?(?P<base>[a-z_]+)\.(?P<kind>weight|bias)$")


class ArchitectureConfig(BaseModel):
    """The subset of a Hugging Face config.json that mlx-lm's qwen2/llama models read."""

    model_type: str
    architectures: list[str]
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    torch_dtype: str = "float16"


def hf_tensor_name(gguf_name: str) -> str | None:
    """Map a GGUF tensor name to its Hugging Face name; `None` for tensors mlx-lm does not use (e.g. rope_freqs)."""
    match = _TENSOR_NAME.match(gguf_name)
    if match is None:
        return None
    base, kind, layer = match["base"], match["kind"], match["layer"]
    if layer is None:
        mapped = _GLOBAL_NAMES.get(base)
        return None if mapped is None else f"{mapped}.{kind}"
    mapped = _BLOCK_NAMES.get(base)
    return None if mapped is None else f"model.layers.{layer}.{mapped}.{kind}"


def unpermute_rotary(weight: npt.NDArray[_Value], head_count: int) -> npt.NDArray[_Value]:
    """Undo llama.cpp's q/k row permutation for llama: GGUF stores interleaved rotary pairs, HF stores halves. Rows
    only move, so it applies as well to rows of quantized blocks (`--cpu-weights gguf` serves them so)."""
    rows = weight.shape[0]
    rest = weight.shape[1:]
    return weight.reshape(head_count, rows // head_count // 2, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


def _config_from_metadata(metadata: GGUFMetadata, vocab_size: int, has_output: bool) -> ArchitectureConfig:
    arch = metadata.architecture
    hidden = metadata.integer(f"{arch}.embedding_length")
    heads = metadata.integer(f"{arch}.attention.head_count")
    key_length = metadata.optional_integer(f"{arch}.attention.key_length")
    rope_key = f"{arch}.rope.freq_base"
    return ArchitectureConfig(
        model_type=arch,
        architectures=["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        hidden_size=hidden,
        num_hidden_layers=metadata.integer(f"{arch}.block_count"),
        intermediate_size=metadata.integer(f"{arch}.feed_forward_length"),
        num_attention_heads=heads,
        num_key_value_heads=metadata.optional_integer(f"{arch}.attention.head_count_kv") or heads,
        head_dim=key_length or hidden // heads,
        rms_norm_eps=metadata.number(f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_theta=metadata.number(rope_key) if metadata.has(rope_key) else 10000.0,
        max_position_embeddings=metadata.integer(f"{arch}.context_length"),
        vocab_size=vocab_size,
        tie_word_embeddings=not has_output,
        bos_token_id=metadata.optional_integer("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.optional_integer("tokenizer.ggml.eos_token_id"),
    )


def _dequantize(tensor: gguf.ReaderTensor) -> npt.NDArray[np.float32]:
    # The reader already reverses GGUF's fastest-dim-first shape, so rows come out in HF (out, in) order.
    values: npt.NDArray[np.float32] = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return values.astype(np.float32, copy=False)


def _convert_weights(
    reader: gguf.GGUFReader, config: ArchitectureConfig, source: Path, progress: ProgressCallback
) -> tuple[dict[str, npt.NDArray[np.float16]], npt.NDArray[np.float32]]:
    """Dequantize and rename every tensor; also return the float32 embedding matrix for the marker rule.

    Progress counts the GGUF bytes of the tensors converted so far (phase "converting").
    """
    weights: dict[str, npt.NDArray[np.float16]] = {}
    embeddings: npt.NDArray[np.float32] | None = None
    used = [(tensor, name) for name, tensor in gguf_tensors(reader).items()]
    counter = ByteCounter("converting", sum(int(tensor.n_bytes) for tensor, _name in used), progress)
    for tensor, name in used:
        try:
            values = _dequantize(tensor)
        except NotImplementedError as error:
            raise ModelLoadError(f"cannot import {source}: tensor {tensor.name}: {error}") from error
        if config.model_type == "llama" and name.endswith("q_proj.weight"):
            values = unpermute_rotary(values, config.num_attention_heads)
        elif config.model_type == "llama" and name.endswith("k_proj.weight"):
            values = unpermute_rotary(values, config.num_key_value_heads)
        if name == "model.embed_tokens.weight":
            embeddings = values
        weights[name] = values.astype(np.float16)
        counter.add(int(tensor.n_bytes))
    if embeddings is None:
        raise ModelLoadError(f"cannot import {source}: no token_embd.weight tensor")
    return weights, embeddings


def gguf_tensors(reader: gguf.GGUFReader) -> dict[str, gguf.ReaderTensor]:
    """The tensors mlx-lm uses, by their Hugging Face names (what the imported safetensors and mlx-lm's module paths
    call them)."""
    return {name: tensor for tensor in reader.tensors if (name := hf_tensor_name(tensor.name)) is not None}


def tensor_record(tensor: gguf.ReaderTensor) -> GgufTensor:
    """What a runner needs of a tensor to read it from the file without gguf's reader (`gguf_source.py`)."""
    return GgufTensor(
        name=tensor.name,
        type=tensor.tensor_type.name,
        shape=tuple(int(size) for size in tensor.shape),
        offset=int(tensor.data_offset),
        nbytes=int(tensor.n_bytes),
    )


def import_gguf(
    gguf_path: Path, out_dir: Path, progress: ProgressCallback = no_progress, *, move_gguf: bool = False
) -> Path:
    """Convert `gguf_path` into `out_dir` (config.json, model.safetensors, tokenizer files) and return `out_dir`.

    The GGUF is kept for `--cpu-weights gguf`: moved into `out_dir` when `move_gguf` (a catalog import's scratch file,
    on the same filesystem), else recorded where it is (`gguf_source.record_gguf`).

    The directory appears atomically: it is built in a temp dir beside `out_dir` and renamed at the end, so a
    failure leaves nothing behind. Raises `ModelLoadError` for unreadable files or unsupported architectures.
    """
    started = time.monotonic()
    try:
        reader = gguf.GGUFReader(gguf_path, "r")
    except Exception as error:
        # The reader trusts the header's counts and shapes: a truncated or corrupt file fails with whatever numpy
        # or struct error the first short read produces (IndexError, ValueError…), none of which says "truncated".
        raise ModelLoadError(
            f"cannot import {gguf_path}: not a readable GGUF file, truncated or corrupt? "
            f"({type(error).__name__}: {error})"
        ) from error
    metadata = GGUFMetadata(reader, gguf_path)
    arch = metadata.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"cannot import {gguf_path}: architecture '{arch}' is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    tokens = metadata.strings("tokenizer.ggml.tokens")
    has_output = any(tensor.name == "output.weight" for tensor in reader.tensors)
    config = _config_from_metadata(metadata, len(tokens), has_output)
    logger.info("importing %s (%s, %d layers) into %s", gguf_path.name, arch, config.num_hidden_layers, out_dir)

    with staged_directory(out_dir) as staging:
        weights, embeddings = _convert_weights(reader, config, gguf_path, progress)
        untrained = find_untrained_markers(tokens, metadata.integers("tokenizer.ggml.token_type"), embeddings)
        if untrained:
            logger.info("encoding untrained marker tokens as plain text: %s", ", ".join(sorted(untrained)))
        del embeddings
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "mlx"})
        del weights
        tokenizer = build_tokenizer(metadata, untrained, gguf_path, config.max_position_embeddings)
        tokenizer.save_pretrained(str(staging))
        (staging / "config.json").write_text(json.dumps(config.model_dump(), indent=2) + "\n")
        tensors = {name: tensor_record(tensor) for name, tensor in gguf_tensors(reader).items()}
        record_gguf(staging, gguf_path, tensors, move=move_gguf)
    logger.info("imported %s in %.1f s", gguf_path.name, time.monotonic() - started)
    return out_dir
