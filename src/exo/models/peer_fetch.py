"""Copying a model's files from a peer over the cluster: the files a pipeline rank needs, checked and atomic.

The peer's manifest lists every file with its size and sha256. The small files (config, tokenizer, template, the
weight index) always come; of the weights, a checkpoint split into files by layer sends only the files holding the
rank's layers and the shared weights, one that does not split sends everything. Each file is written to a hidden
partial file beside its final name while its sha256 is computed, checked against the manifest, then renamed into
place: a model directory never holds a half-written or corrupt file under a real name. A file already present with
the manifest's size and checksum is not fetched again.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Final

import zenoh

from exo.models.gguf_source import date_copied_gguf
from exo.models.peer_files import files_key, sha256_of
from exo.models.progress import ByteCounter, ProgressCallback, no_progress
from exo.models.shard_files import WEIGHT_INDEX_FILE, files_for_layers
from exo.shared.types.common import ModelId, NodeId
from exo.shared.types.model_files import ChunkRequest, ManifestFile, ManifestRequest, ModelManifest

CHUNK_BYTES: Final = 8 * 1024 * 1024
QUERY_TIMEOUT_SECONDS: Final = 60.0


class PeerFetchError(RuntimeError):
    """The files could not be copied from the peer; the message says which and why."""


class PeerFiles:
    """A peer's files of one model, read over the cluster session."""

    def __init__(self, session: zenoh.Session, root: str, peer: NodeId, model_id: ModelId) -> None:
        self._session = session
        self._key = files_key(root, peer)
        self._peer = peer
        self.model_id = model_id

    def manifest(self) -> ModelManifest:
        return ModelManifest.model_validate_json(self._ask(ManifestRequest(model_id=self.model_id).model_dump_json()))

    def chunk(self, name: str, offset: int, length: int) -> bytes:
        request = ChunkRequest(model_id=self.model_id, name=name, offset=offset, length=length)
        return self._ask(request.model_dump_json())

    def _ask(self, request: str) -> bytes:
        for reply in self._session.get(self._key, payload=request.encode(), timeout=QUERY_TIMEOUT_SECONDS):
            if reply.ok is not None:
                return reply.ok.payload.to_bytes()
            if reply.err is not None:
                raise PeerFetchError(f"node {self._peer}: {reply.err.payload.to_bytes().decode(errors='replace')}")
        raise PeerFetchError(f"node {self._peer} did not answer a request for model {self.model_id}'s files")


def needed_files(manifest: ModelManifest, weight_map: dict[str, str] | None, start: int, end: int | None) -> list[str]:
    """The manifest's files a rank running layers [start, end) needs (`end` None: the whole model)."""
    weights = [entry.name for entry in manifest.files if entry.name.endswith(".safetensors")]
    others = [entry.name for entry in manifest.files if not entry.name.endswith(".safetensors")]
    if weight_map is None:
        return [*others, *weights]
    wanted = set(files_for_layers(weight_map, start, end if end is not None else 1 << 30))
    return [*others, *(name for name in weights if name in wanted)]


def fetch_model_files(
    peer: PeerFiles, target_dir: Path, start: int, end: int | None, progress: ProgressCallback = no_progress
) -> list[str]:
    """Copy what a rank running layers [start, end) needs into `target_dir`; returns the names copied."""
    manifest = peer.manifest()
    target_dir.mkdir(parents=True, exist_ok=True)
    index = manifest.file(WEIGHT_INDEX_FILE)
    if index is not None and not _present(target_dir, index):
        _copy(peer, index, target_dir, ByteCounter("downloading", index.size, no_progress))
    weight_map = _weight_map(target_dir) if index is not None else None
    entries = [manifest.file(name) for name in needed_files(manifest, weight_map, start, end)]
    missing = [entry for entry in entries if entry is not None and not _present(target_dir, entry)]
    counter = ByteCounter("downloading", sum(entry.size for entry in missing), progress)
    for entry in missing:
        _copy(peer, entry, target_dir, counter)
    # The kept GGUF's record names its modification time; the copy (checked against the peer's checksum) gets it.
    date_copied_gguf(target_dir)
    return [entry.name for entry in missing]


def _weight_map(target_dir: Path) -> dict[str, str]:
    document: object = json.loads((target_dir / WEIGHT_INDEX_FILE).read_text())
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict):
        raise PeerFetchError(f"{WEIGHT_INDEX_FILE} from the peer has no weight_map")
    return {str(name): str(file) for name, file in weight_map.items()}


def _present(target_dir: Path, entry: ManifestFile) -> bool:
    path = target_dir / entry.name
    return path.is_file() and path.stat().st_size == entry.size and sha256_of(path) == entry.sha256


def _copy(peer: PeerFiles, entry: ManifestFile, target_dir: Path, counter: ByteCounter) -> None:
    if Path(entry.name).name != entry.name or entry.name.startswith("."):
        raise PeerFetchError(f"the peer listed a file name that is not a plain name: {entry.name!r}")
    partial = target_dir / f".{entry.name}.partial"
    digest = hashlib.sha256()
    with partial.open("wb") as file:
        offset = 0
        while offset < entry.size:
            data = peer.chunk(entry.name, offset, min(CHUNK_BYTES, entry.size - offset))
            if not data:
                raise PeerFetchError(f"{entry.name} ended at {offset} of {entry.size} bytes on the peer")
            file.write(data)
            digest.update(data)
            offset += len(data)
            counter.add(len(data))
        file.flush()
        os.fsync(file.fileno())
    if offset != entry.size or digest.hexdigest() != entry.sha256:
        partial.unlink(missing_ok=True)
        raise PeerFetchError(f"{entry.name} from the peer does not match its sha256 (or size); it was not kept")
    os.replace(partial, target_dir / entry.name)
