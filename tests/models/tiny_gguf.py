"""Build tiny qwen2/llama checkpoints and write them as GGUF files, as llama.cpp's converter would."""

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType, TokenType
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen2
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 128
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
UNTRAINED_MARKERS = ("<tool_call>", "</tool_call>")
TRAINED_MARKER = "<think>"
PADDING_COUNT = 4

# Tensors quantized the way real checkpoints mix types; the rest stay F32 (norms, biases).
QUANTIZATION = {
    "token_embd.weight": GGMLQuantizationType.Q8_0,
    "output.weight": GGMLQuantizationType.Q8_0,
    "attn_q.weight": GGMLQuantizationType.Q5_0,
    "attn_k.weight": GGMLQuantizationType.Q4_0,
    "attn_v.weight": GGMLQuantizationType.Q8_0,
    "attn_output.weight": GGMLQuantizationType.F16,
    "ffn_gate.weight": GGMLQuantizationType.Q5_1,
    "ffn_up.weight": GGMLQuantizationType.Q4_1,
    "ffn_down.weight": GGMLQuantizationType.F32,
}
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


@dataclass(frozen=True)
class TinyTokenizer:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    reference: Tokenizer  # the trained tokenizer, markers excluded, to compare encodings against


def _training_text() -> list[str]:
    words = ["def", "return", "weather", "Paris", "city", "function", "number", "import", "print", "class"]
    lines = [f"{word} {words[i - 1]}(x, {i}): y = {i} + {i * 7}" for i, word in enumerate(words)]
    return [*lines, "Hello, world! What is the weather in Paris?", '{"name": "get_weather"}'] * 20


def build_tokenizer() -> TinyTokenizer:
    """Train a byte-level BPE with the Qwen2 split, then append control tokens, markers and padding."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_training_text(), trainer)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=lambda token: vocab[token])
    raw_merges: list[list[str] | str] = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in raw_merges]
    token_types = [int(TokenType.NORMAL)] * len(tokens)
    extra = [(token, TokenType.CONTROL) for token in CONTROL_TOKENS]
    extra += [(token, TokenType.USER_DEFINED) for token in (*UNTRAINED_MARKERS, TRAINED_MARKER)]
    extra += [(f"[PAD{len(tokens) + len(extra) + i}]", TokenType.UNUSED) for i in range(PADDING_COUNT)]
    for token, kind in extra:
        tokens.append(token)
        token_types.append(int(kind))
    tokenizer.add_special_tokens(list(CONTROL_TOKENS))
    tokenizer.add_tokens([TRAINED_MARKER])
    return TinyTokenizer(tokens=tokens, token_types=token_types, merges=merges, reference=tokenizer)


def make_model(arch: str, vocab_size: int, *, tied: bool) -> nn.Module:
    """An mlx-lm qwen2 or llama model of the tiny shape, randomly initialised."""
    if arch == "qwen2":
        return qwen2.Model(
            qwen2.ModelArgs(
                model_type="qwen2",
                hidden_size=HIDDEN,
                num_hidden_layers=LAYERS,
                intermediate_size=INTERMEDIATE,
                num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS,
                rms_norm_eps=1e-6,
                vocab_size=vocab_size,
                rope_theta=10000.0,
                tie_word_embeddings=tied,
            )
        )
    return llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            intermediate_size=INTERMEDIATE,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            rms_norm_eps=1e-6,
            vocab_size=vocab_size,
            rope_theta=10000.0,
            tie_word_embeddings=tied,
        )
    )


def build_model(arch: str, tokenizer: TinyTokenizer, seed: int) -> dict[str, npt.NDArray[np.float32]]:
    """Random weights of a tiny qwen2 or llama model, as HF-named float32 arrays.

    The UNUSED rows and the untrained markers' rows get one shared vector (plus float noise), as in checkpoints
    whose padding rows were never trained; every other row stays random.
    """
    vocab_size = len(tokenizer.tokens)
    mx.random.seed(seed)
    model = make_model(arch, vocab_size, tied=False)
    weights = {name: np.array(value, dtype=np.float32) for name, value in tree_flatten(model.parameters())}
    embeddings = weights["model.embed_tokens.weight"]
    untrained = [
        index
        for index, (token, kind) in enumerate(zip(tokenizer.tokens, tokenizer.token_types, strict=True))
        if kind == TokenType.UNUSED or token in UNTRAINED_MARKERS
    ]
    noise = np.random.default_rng(seed).normal(0.0, 1e-4, size=(len(untrained), HIDDEN)).astype(np.float32)
    embeddings[untrained] = embeddings[untrained[-1]] + noise
    return weights


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_TO_GGUF[module]}.{kind}"


def _quantization_for(name: str) -> GGMLQuantizationType:
    return QUANTIZATION.get(name, QUANTIZATION.get(name.split(".", 2)[-1], GGMLQuantizationType.F32))


def permute_rotary(weight: npt.NDArray[np.float32], head_count: int) -> npt.NDArray[np.float32]:
    """llama.cpp's convert_hf_to_gguf permutation of llama q/k rows (the inverse of `unpermute_rotary`)."""
    rows = weight.shape[0]
    return (
        weight.reshape(head_count, 2, rows // head_count // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_gguf(
    path: Path,
    arch: str,
    weights: dict[str, npt.NDArray[np.float32]],
    tokenizer: TinyTokenizer,
    *,
    with_output: bool,
    tokenizer_model: str = "gpt2",
) -> dict[str, npt.NDArray[np.float32]]:
    """Write `weights` as GGUF with mixed quantization; return the weights as the GGUF actually stores them."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokenizer.tokens)
    writer.add_token_types(tokenizer.token_types)
    writer.add_token_merges(tokenizer.merges)
    writer.add_bos_token_id(tokenizer.tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokenizer.tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokenizer.tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    stored: dict[str, npt.NDArray[np.float32]] = {}
    for hf_name, value in weights.items():
        if hf_name == "lm_head.weight" and not with_output:
            continue
        name = gguf_name(hf_name)
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            # Kept F32 so the expected weights are the originals and only the un-permutation is under test.
            on_disk = permute_rotary(value, HEADS if "q_proj" in hf_name else KV_HEADS)
            writer.add_tensor(name, on_disk, raw_dtype=GGMLQuantizationType.F32)
            stored[hf_name] = value
            continue
        qtype = _quantization_for(name)
        quantized = gguf.quants.quantize(value, qtype)
        writer.add_tensor(name, quantized, raw_dtype=qtype)
        stored[hf_name] = gguf.quants.dequantize(quantized, qtype).astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored
