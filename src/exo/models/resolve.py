"""Turn the `--model` argument into a local directory that `mlx_lm.load` can open."""

import hashlib
import re
from pathlib import Path
from typing import Literal

from exo.models.catalog import DEFAULT_MODEL_ID, QWEN25_CODER_05B, find_entry
from exo.models.catalog_fetch import ensure_catalog_model
from exo.models.errors import InvalidModelIdError, ModelLoadError, ModelNotFoundError
from exo.models.paths import default_models_dir
from exo.models.progress import ProgressCallback, no_progress
from exo.shared.types.common import FrozenModel, ModelId

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_LOCAL_NAME = re.compile(rf"^{_NAME}$")
_REPO_ID = re.compile(rf"^{_NAME}/{_NAME}$")
_GGUF_SUFFIX = ".gguf"


class ResolvedModel(FrozenModel):
    """A model ready to load: the id shown in /v1/models, its local directory, and where it came from."""

    model_id: ModelId
    path: Path
    source: Literal["directory", "gguf", "huggingface", "default", "catalog"]


def _is_model_directory(path: Path) -> bool:
    return (path / "config.json").is_file()


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", "~", "."))


def _gguf_model_id(gguf_path: Path) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", gguf_path.stem.lower()).strip("-.") or "gguf-model"


def _resolve_gguf(gguf_path: Path, models_dir: Path, progress: ProgressCallback) -> ResolvedModel:
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file {gguf_path} does not exist")
    model_id = _gguf_model_id(gguf_path)
    # Key the cache on where the file is and which version of it, so an edited file is imported again.
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = models_dir / f"{model_id}-{key}"
    if not _is_model_directory(target):
        # Imported here: the converter pulls in gguf and transformers, seconds of every node's start otherwise.
        from exo.models.gguf_import import import_gguf

        import_gguf(gguf_path, target, progress)
    return ResolvedModel(model_id=ModelId(model_id), path=target, source="gguf")


def _resolve_repository(repo_id: str, models_dir: Path) -> ResolvedModel:
    target = models_dir / repo_id.replace("/", "--")
    if not _is_model_directory(target):
        # Imported here: huggingface_hub takes seconds to import and most nodes never download from the hub.
        from exo.models.huggingface import download_repository

        download_repository(repo_id, target)
    return ResolvedModel(model_id=ModelId(repo_id), path=target, source="huggingface")


def model_id_for(spec: str | None) -> ModelId:
    """The id `spec` is (or would be) served under, worked out without fetching or converting anything.

    Used to name a model whose preparation failed, so requests for it get the failure's reason.
    """
    if spec is None or spec in ("default", DEFAULT_MODEL_ID):
        return DEFAULT_MODEL_ID
    path = Path(spec).expanduser()
    if spec.lower().endswith(_GGUF_SUFFIX):
        return ModelId(_gguf_model_id(path))
    if path.is_dir() or _looks_like_path(spec):
        return ModelId(path.resolve().name or spec)
    return ModelId(spec)


def resolve_model(
    spec: str | None, models_dir: Path | None = None, progress: ProgressCallback = no_progress
) -> ResolvedModel:
    """Resolve `spec` to a local model directory, fetching or converting it into `models_dir` when needed.

    - `None`, `"default"` or the default id: the bundled Qwen2.5-Coder-0.5B-Instruct, imported once.
    - a catalog id (`exo models` lists them, e.g. `qwen2.5-coder-1.5b-instruct`): downloaded and imported once.
    - an existing directory with a config.json: used as is.
    - a path ending in `.gguf`: imported once into `models_dir` (cached by path, size and mtime).
    - a bare name present in `models_dir` (e.g. `tiny-qwen-tools`): that directory.
    - `owner/name`: a Hugging Face repository, downloaded into `models_dir/owner--name` unless already there.

    Raises `InvalidModelIdError` for specs that try to leave `models_dir` (`../../etc`), `ModelNotFoundError` when
    nothing matches and `ModelLoadError` when a found model cannot be fetched or converted. Long steps (download,
    GGUF assembly, conversion) report to `progress`.
    """
    models_dir = models_dir if models_dir is not None else default_models_dir()
    if spec is None or spec in ("default", DEFAULT_MODEL_ID):
        path = ensure_catalog_model(QWEN25_CODER_05B, models_dir, progress)
        return ResolvedModel(model_id=DEFAULT_MODEL_ID, path=path, source="default")
    entry = find_entry(spec)
    if entry is not None:
        path = ensure_catalog_model(entry, models_dir, progress)
        return ResolvedModel(model_id=entry.model_id, path=path, source="catalog")
    path = Path(spec).expanduser()
    if spec.lower().endswith(_GGUF_SUFFIX):
        return _resolve_gguf(path, models_dir, progress)
    if path.is_dir() and _is_model_directory(path):
        return ResolvedModel(model_id=ModelId(path.resolve().name), path=path, source="directory")
    if ".." in Path(spec).parts:
        raise InvalidModelIdError(
            f"invalid model '{spec}': '..' path traversal is not allowed; pass an existing model directory, "
            "a .gguf file, a model name in the models directory, or a Hugging Face id owner/name"
        )
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory but not a model: it has no config.json")
    if _looks_like_path(spec):
        raise ModelNotFoundError(f"model directory {path} does not exist")
    if _LOCAL_NAME.match(spec):
        local = models_dir / spec
        if _is_model_directory(local):
            return ResolvedModel(model_id=ModelId(spec), path=local, source="directory")
        raise ModelNotFoundError(
            f"no model named '{spec}' in {models_dir}; pass a directory, a .gguf file or a Hugging Face id owner/name"
        )
    if _REPO_ID.match(spec) and ".." not in spec:
        return _resolve_repository(spec, models_dir)
    raise InvalidModelIdError(
        f"invalid model '{spec}': expected a directory, a .gguf file, a local model name or a Hugging Face id "
        "owner/name"
    )
