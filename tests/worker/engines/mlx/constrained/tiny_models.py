"""Tiny random-weight Qwen2 models with locally trained byte-level BPE tokenizers, saved as mlx-lm directories.

Two tokenizer variants: one where `<tool_call>`, `</tool_call>`, `<think>`, `</think>` and `<|python_tag|>` are
added tokens (as in Qwen's and Llama's own tokenizers) and one where they are only text, spelled in ordinary
pieces (as in the default model's imported tokenizer).
"""

import json
import string
from pathlib import Path
from typing import Final

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import qwen2
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

END_OF_TURN: Final = "<|im_end|>"
MARKERS: Final = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>")
_TARGET_VOCABULARY: Final = 500

_CORPUS: Final = [
    "<think>\nThe user wants the weather.\n</think>\n\n",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
    '{"name": "search", "parameters": {"query": "weather in Paris", "limit": 10, "tags": ["a", "b"]}}',
    '{"path": "/tmp/file.txt", "content": "hello", "options": {"recursive": true, "depth": 3}}',
    "The quick brown fox jumps over the lazy dog. Hello world, how are you today?",
    "I can help with that. Let me look up the weather for you in Paris and London.",
    string.ascii_letters + string.digits + string.punctuation + " \n\t",
]


def build_tool_model(directory: Path, *, markers_are_added_tokens: bool, seed: int = 0) -> Path:
    """Write tokenizer, config and random weights for a hidden-64, 2-layer Qwen2 model into `directory`."""
    tokenizer = _train_tokenizer(markers_are_added_tokens)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TURN)
    fast.chat_template = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    config = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        # Padded past the tokenizer, as real checkpoints are: those extra ids must never be sampled.
        "vocab_size": len(fast) + 7,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    (directory / "config.json").write_text(json.dumps(config))
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return directory


def _train_tokenizer(markers_are_added_tokens: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TARGET_VOCABULARY,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[END_OF_TURN],
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 50, trainer)
    if markers_are_added_tokens:
        tokenizer.add_special_tokens([AddedToken(marker, special=True) for marker in MARKERS])
    return tokenizer
