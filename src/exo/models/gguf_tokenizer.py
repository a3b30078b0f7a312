"""Rebuild a Hugging Face fast tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file.

transformers' own GGUF tokenizer path needs torch, which this project does not install, so the byte-level BPE
is assembled directly with `tokenizers` and wrapped in `PreTrainedTokenizerFast`.
"""

from collections.abc import Set as AbstractSet
from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import TokenType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from exo.models.errors import ModelLoadError
from exo.models.gguf_metadata import GGUFMetadata

# Pre-tokenizer split patterns, keyed by `tokenizer.ggml.pre` (the same table llama.cpp keeps).
_CONTRACTIONS_AND_WORDS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
_PUNCTUATION_AND_SPACES = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_PATTERN = _CONTRACTIONS_AND_WORDS + r"|\p{N}" + _PUNCTUATION_AND_SPACES  # digits one at a time
_LLAMA3_PATTERN = _CONTRACTIONS_AND_WORDS + r"|\p{N}{1,3}" + _PUNCTUATION_AND_SPACES
_SPLIT_PATTERNS = {"qwen2": _QWEN2_PATTERN, "llama-bpe": _LLAMA3_PATTERN, "llama3": _LLAMA3_PATTERN}

# A marker row counts as untrained when it lies this close (relative L2 distance) to the mean unused-token row.
_UNTRAINED_RELATIVE_DISTANCE = 0.05


def find_untrained_markers(
    tokens: list[str], token_types: list[int], embeddings: npt.NDArray[np.float32]
) -> frozenset[str]:
    """Return the USER_DEFINED tokens whose embedding row is indistinguishable from the padding rows.

    Rule: take the mean embedding of the UNUSED tokens (`[PAD…]` rows, never seen in training); a USER_DEFINED
    token whose row lies within 5 % (relative L2) of that mean was never trained either. Such markers are not
    registered as added tokens, so their text is encoded from ordinary BPE pieces the model does know. In the
    default Qwen2.5-Coder-0.5B checkpoint this catches exactly `<tool_call>` / `</tool_call>` (relative distance
    under 0.5 %, against 40 % for `<|im_start|>`): the model then writes the tags piece by piece instead of never
    emitting them. CONTROL tokens (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, …) are never demoted: they
    delimit the chat format and must stay special whatever their rows look like. Without UNUSED rows there is no
    reference, and nothing is demoted.
    """
    unused_rows = [index for index, kind in enumerate(token_types) if kind == TokenType.UNUSED]
    if not unused_rows or embeddings.shape[0] < len(tokens):
        return frozenset()
    padding = embeddings[unused_rows].mean(axis=0)
    scale = float(np.linalg.norm(padding)) or 1.0
    return frozenset(
        token
        for index, (token, kind) in enumerate(zip(tokens, token_types, strict=True))
        if kind == TokenType.USER_DEFINED
        and float(np.linalg.norm(embeddings[index] - padding)) / scale < _UNTRAINED_RELATIVE_DISTANCE
    )


def _build_bpe(metadata: GGUFMetadata, tokens: list[str], pre: str) -> Tokenizer:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)  # later duplicates keep the first id, as llama.cpp does
    merge_pairs = [tuple(merge.split(" ", 1)) for merge in metadata.strings("tokenizer.ggml.merges")]
    merges = [(left, right) for left, right in merge_pairs]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in ("llama-bpe", "llama3")))
    pattern = _SPLIT_PATTERNS.get(pre)
    if pattern is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    if pre == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _add_post_processor(tokenizer: Tokenizer, bos_token: str | None, bos_id: int | None, add_bos: bool) -> None:
    if add_bos and bos_token is not None and bos_id is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B", special_tokens=[(bos_token, bos_id)]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)


def _token_at(tokens: list[str], index: int | None) -> str | None:
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def build_tokenizer(
    metadata: GGUFMetadata, untrained_markers: AbstractSet[str], source: Path, context_length: int
) -> PreTrainedTokenizerFast:
    """Assemble the tokenizer: byte-level BPE, CONTROL tokens as special, trained USER_DEFINED tokens as added.

    `untrained_markers` (see `find_untrained_markers`) are left out of the added tokens so they encode as text.
    """
    model_kind = metadata.string("tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ModelLoadError(
            f"cannot import {source}: tokenizer model '{model_kind}' is not supported (only byte-level BPE 'gpt2')"
        )
    tokens = metadata.strings("tokenizer.ggml.tokens")
    token_types = metadata.integers("tokenizer.ggml.token_type")
    pre = metadata.optional_string("tokenizer.ggml.pre") or "default"
    tokenizer = _build_bpe(metadata, tokens, pre)

    special = [
        AddedToken(token, special=True, normalized=False)
        for token, kind in zip(tokens, token_types, strict=True)
        if kind == TokenType.CONTROL
    ]
    plain = [
        AddedToken(token, special=False, normalized=False)
        for token, kind in zip(tokens, token_types, strict=True)
        if kind == TokenType.USER_DEFINED and token not in untrained_markers
    ]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(plain)

    bos_id = metadata.optional_integer("tokenizer.ggml.bos_token_id")
    bos_token = _token_at(tokens, bos_id)
    add_bos = metadata.boolean("tokenizer.ggml.add_bos_token", default=False)
    _add_post_processor(tokenizer, bos_token, bos_id, add_bos)

    eos_token = _token_at(tokens, metadata.optional_integer("tokenizer.ggml.eos_token_id"))
    pad_token = _token_at(tokens, metadata.optional_integer("tokenizer.ggml.padding_token_id"))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos_token if add_bos else None,
        eos_token=eos_token,
        pad_token=pad_token,
        chat_template=metadata.optional_string("tokenizer.chat_template"),
        model_max_length=context_length,
        clean_up_tokenization_spaces=False,
    )
