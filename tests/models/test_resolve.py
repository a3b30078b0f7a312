"""resolve_model: every kind of --model spec, and the errors for the ones that cannot work."""

import json
from pathlib import Path

import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from exo.models import huggingface
from exo.models.errors import InvalidModelIdError, ModelLoadError, ModelNotFoundError
from exo.models.paths import default_models_dir, exo_home
from exo.models.resolve import resolve_model
from tests.models.tiny_gguf import build_model, build_tokenizer, write_gguf


def _model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return path


def test_existing_directory_is_used_as_is(tmp_path: Path) -> None:
    directory = _model_dir(tmp_path / "my-model")
    resolved = resolve_model(str(directory), models_dir=tmp_path / "models")
    assert (resolved.path, resolved.model_id, resolved.source) == (directory, "my-model", "directory")


def test_bare_name_finds_a_model_in_models_dir(tmp_path: Path) -> None:
    directory = _model_dir(tmp_path / "models" / "tiny-qwen-tools")
    resolved = resolve_model("tiny-qwen-tools", models_dir=tmp_path / "models")
    assert (resolved.path, resolved.model_id, resolved.source) == (directory, "tiny-qwen-tools", "directory")


@pytest.mark.parametrize("spec", ["../../etc", "../../../../../../etc/passwd", "owner/../../etc", "a/..", "x/../y"])
def test_path_traversal_is_rejected(tmp_path: Path, spec: str) -> None:
    with pytest.raises(InvalidModelIdError, match="path traversal"):
        resolve_model(spec, models_dir=tmp_path / "models")


def test_malformed_ids_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelIdError, match="a/b/c"):
        resolve_model("a/b/c", models_dir=tmp_path / "models")


def test_missing_local_name_names_the_model_and_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"no model named 'nope' in .*models"):
        resolve_model("nope", models_dir=tmp_path / "models")


def test_missing_directory_and_gguf_are_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "absent"), models_dir=tmp_path / "models")
    with pytest.raises(ModelNotFoundError, match=r"absent\.gguf does not exist"):
        resolve_model(str(tmp_path / "absent.gguf"), models_dir=tmp_path / "models")


def test_directory_without_config_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        resolve_model(str(tmp_path / "empty"), models_dir=tmp_path / "models")


def test_offline_download_fails_clearly_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(repo_id: str, local_dir: Path) -> str:
        (Path(local_dir) / "partial.bin").write_bytes(b"half")
        raise LocalEntryNotFoundError(f"cannot reach the hub for {repo_id}")

    monkeypatch.setattr(huggingface, "snapshot_download", unreachable)
    models_dir = tmp_path / "models"
    with pytest.raises(
        ModelLoadError, match="cannot download mlx-community/Qwen3-4B-4bit: no network / hub unreachable"
    ):
        resolve_model("mlx-community/Qwen3-4B-4bit", models_dir=models_dir)
    assert list(models_dir.iterdir()) == []


def test_download_lands_in_models_dir_then_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_download(repo_id: str, local_dir: Path) -> str:
        calls.append(repo_id)
        (Path(local_dir) / "config.json").write_text("{}")
        return str(local_dir)

    monkeypatch.setattr(huggingface, "snapshot_download", fake_download)
    models_dir = tmp_path / "models"
    first = resolve_model("mlx-community/Qwen3-4B-4bit", models_dir=models_dir)
    second = resolve_model("mlx-community/Qwen3-4B-4bit", models_dir=models_dir)
    assert first == second
    assert (first.model_id, first.source) == ("mlx-community/Qwen3-4B-4bit", "huggingface")
    assert first.path == models_dir / "mlx-community--Qwen3-4B-4bit"
    assert (first.path / "config.json").is_file()
    assert calls == ["mlx-community/Qwen3-4B-4bit"]
    assert sorted(entry.name for entry in models_dir.iterdir()) == ["mlx-community--Qwen3-4B-4bit"]


def test_gguf_is_imported_once_then_reused(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    write_gguf(tmp_path / "Tiny-Q8.gguf", "qwen2", build_model("qwen2", tokenizer, seed=3), tokenizer, with_output=True)
    models_dir = tmp_path / "models"
    first = resolve_model(str(tmp_path / "Tiny-Q8.gguf"), models_dir=models_dir)
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns
    second = resolve_model(str(tmp_path / "Tiny-Q8.gguf"), models_dir=models_dir)
    assert (first.model_id, first.source) == ("tiny-q8", "gguf")
    assert first.path.parent == models_dir
    assert second == first
    assert (second.path / "model.safetensors").stat().st_mtime_ns == stamp


def test_exo_home_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXO_HOME", str(tmp_path / "home"))
    assert exo_home() == tmp_path / "home"
    assert default_models_dir() == tmp_path / "home" / "models"
    monkeypatch.delenv("EXO_HOME")
    assert exo_home() == Path.home() / ".cache" / "exo"
