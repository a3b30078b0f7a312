"""A loaded tokenizer without the Python copies transformers built its Rust backend from.

transformers' BPE tokenizers of the Qwen2 and Llama families build their `tokenizers` backend from a vocabulary dict
and a merges list parsed from tokenizer.json, and keep both (`_vocab`, `_merges`) though nothing reads them again:
encoding, decoding, `get_vocab` and the added tokens all go through the backend. For a 151,936-token vocabulary that
is about 50 MB of Python objects in every runner (measured on the default model: 116 MB for the loaded tokenizer,
66 MB without them).

mlx-lm's streaming detokenizer for those tokenizers (`BPEStreamingDetokenizer`) also keeps every token's string in a
list (`tokenmap`, read one token at a time as a reply streams): 24 MiB of the default model's 71 (measured with the
collector run and the heap trimmed). The backend answers the same strings (`convert_ids_to_tokens` is its
`id_to_token`), so the list is replaced by a view that asks it (`BackendTokens`, a fraction of a microsecond a
token).
"""

from typing import cast

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from tokenizers import Tokenizer

_CONSTRUCTION_COPIES = {"_vocab": dict, "_merges": list}
"""The attribute of each copy and its type, emptied when the tokenizer holds it so."""


def drop_construction_copies(tokenizer: TokenizerWrapper) -> list[str]:
    """Empty what `tokenizer` keeps only from its construction (where it has a Rust backend and holds them);
    returns the names emptied."""
    held = cast(object, tokenizer._tokenizer)  # pyright: ignore[reportPrivateUsage] -- mlx-lm exposes no accessor
    if getattr(held, "_tokenizer", None) is None:  # no Rust backend: the Python copies may be what it encodes with
        return []
    emptied: list[str] = []
    for name, kind in _CONSTRUCTION_COPIES.items():
        if isinstance(getattr(held, name, None), kind):
            setattr(held, name, kind())
            emptied.append(name)
    return emptied


class BackendTokens:
    """`tokenmap` of a BPE streaming detokenizer answered by the tokenizer's Rust backend (None past its vocabulary,
    as `convert_ids_to_tokens`)."""

    def __init__(self, backend: Tokenizer, size: int) -> None:
        self._backend = backend
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, token: int) -> str | None:
        if not 0 <= token < self._size:
            raise IndexError(f"token id {token} is outside the tokenizer's {self._size}")
        return self._backend.id_to_token(token)


def share_detokenizer_tokens(tokenizer: TokenizerWrapper) -> bool:
    """Replace the BPE streaming detokenizer's list of token strings by `BackendTokens` (where it is mlx-lm's BPE
    detokenizer over a Rust backend); returns whether it was replaced."""
    detokenizer = cast(object, tokenizer._detokenizer)  # pyright: ignore[reportPrivateUsage] -- no accessor
    backend = getattr(cast(object, tokenizer._tokenizer), "_tokenizer", None)  # pyright: ignore[reportPrivateUsage]
    if type(detokenizer) is not BPEStreamingDetokenizer or not isinstance(backend, Tokenizer):
        return False
    tokens = cast(list[str | None], detokenizer.tokenmap)
    detokenizer.tokenmap = BackendTokens(backend, len(tokens))
    return True
