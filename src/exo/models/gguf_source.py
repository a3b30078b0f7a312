"""The GGUF a model directory was imported from, kept for `--cpu-weights gguf` (issue 33), which serves the file's own
blocks instead of the imported float16 copy.

A catalog import moves its scratch GGUF into the model directory (`model.gguf`). A user's own .gguf is left where it
is and recorded by path, size and modification time: a hard link would save nothing on disk either way, and the
staging step's chmod of everything in the new directory would change the user's file through it. A record that no
longer matches the file (moved, edited, replaced) counts as no GGUF kept. Either way `gguf-source.json` also lists
each imported tensor's type, shape, offset and bytes in the GGUF: what the weights take in memory under
`--cpu-weights gguf`, and where a runner reads each from (gguf's reader parses every metadata field, the
tokenizer's 150,000 strings included: 84 s on a loaded 2-core machine, for nothing the runner needs). Never
imports gguf, numpy or mlx: the footprint reads the record on every node's start.
"""

import os
from pathlib import Path
from typing import Final

from pydantic import BaseModel

KEPT_GGUF_NAME: Final = "model.gguf"
"""A catalog import's GGUF, moved into its model directory."""
RECORD_NAME: Final = "gguf-source.json"


class GgufTensor(BaseModel):
    """One tensor of a GGUF as its header describes it."""

    name: str
    """Its GGUF name (`blk.0.attn_q.weight`)."""
    type: str
    """Its ggml type's name (Q4_K, Q5_0, F32...)."""
    shape: tuple[int, ...]
    """GGUF order: the fastest-varying dimension first (a matrix's row length, then its rows)."""
    offset: int
    """Where its data starts in the file."""
    nbytes: int


class GgufSource(BaseModel):
    """Where a model directory's GGUF is and which version of it, and each tensor the import used (by its Hugging
    Face name, as the imported safetensors name it)."""

    path: str
    """`KEPT_GGUF_NAME` for a file inside the model directory, else the user's file's absolute path."""
    size: int
    mtime_ns: int
    tensors: dict[str, GgufTensor]

    @property
    def tensor_bytes(self) -> dict[str, int]:
        return {name: tensor.nbytes for name, tensor in self.tensors.items()}


def record_gguf(model_dir: Path, gguf_path: Path, tensors: dict[str, GgufTensor], *, move: bool) -> None:
    """Keep `gguf_path` for `model_dir` (a directory being built): moved into it when `move` (the file must be on the
    same filesystem: a catalog import's scratch file is), else recorded where it is."""
    if move:
        kept = model_dir / KEPT_GGUF_NAME
        os.replace(gguf_path, kept)
        named = KEPT_GGUF_NAME
    else:
        kept = gguf_path.resolve()
        named = str(kept)
    stat = kept.stat()
    record = GgufSource(path=named, size=stat.st_size, mtime_ns=stat.st_mtime_ns, tensors=tensors)
    (model_dir / RECORD_NAME).write_text(record.model_dump_json(indent=2) + "\n")


def read_gguf_source(model_dir: Path) -> GgufSource | None:
    """The record of `model_dir`'s GGUF, or None for a model imported without one (before exo kept them, or not
    from a GGUF)."""
    record = model_dir / RECORD_NAME
    if not record.is_file():
        return None
    try:
        return GgufSource.model_validate_json(record.read_text())
    except ValueError:
        return None


def kept_gguf(model_dir: Path) -> Path | None:
    """The GGUF `model_dir` was imported from, where it is still the version imported; else None."""
    source = read_gguf_source(model_dir)
    if source is None:
        return None
    path = model_dir / source.path  # an absolute recorded path replaces the directory
    try:
        stat = path.stat()
    except OSError:
        return None
    return path if (stat.st_size, stat.st_mtime_ns) == (source.size, source.mtime_ns) else None


def date_copied_gguf(model_dir: Path) -> Path | None:
    """Give a copied model directory's `model.gguf` the modification time its record names, where its size matches
    (a copy checked byte for byte against the original's checksum, as a peer's is: the record then keeps it);
    returns the file, or None where the record names no such file."""
    source = read_gguf_source(model_dir)
    if source is None or source.path != KEPT_GGUF_NAME:
        return None
    path = model_dir / KEPT_GGUF_NAME
    if not path.is_file() or path.stat().st_size != source.size:
        return None
    os.utime(path, ns=(source.mtime_ns, source.mtime_ns))
    return path


def gguf_missing_reason(model_dir: Path, catalog_ids: tuple[str, ...]) -> str:
    """Why `model_dir` has no usable GGUF, and how to import it again with one (`catalog_ids`: the catalog's model
    ids, whose directories bear their names)."""
    source = read_gguf_source(model_dir)
    if source is None:
        why = f"{model_dir} was imported without keeping its GGUF (imported before exo kept them, or not from a GGUF)"
    else:
        why = f"{model_dir}'s GGUF {source.path} is gone or changed since the import"
    if model_dir.name in catalog_ids:
        how = f"import it again with `exo models download {model_dir.name} --force`"
    else:
        how = f"remove {model_dir} and start exo with the .gguf path again, which imports it again"
    return f"{why}: {how}"


def gguf_tensor_bytes(model_dir: Path) -> dict[str, int] | None:
    """Each imported tensor's bytes in `model_dir`'s GGUF (by Hugging Face name), or None without a record."""
    source = read_gguf_source(model_dir)
    return None if source is None else source.tensor_bytes
