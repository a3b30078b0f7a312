"""Serving this node's model files to its peers over the cluster's zenoh session, so that a cluster without internet
access can run a model from one node's copy.

Peers query `<root>/files/<node id>` with a typed request: the manifest of a model (its files, sizes and sha256), or
a chunk of one of those files. Only models this node has registered (the ones it prepared) are served, and only the
plain files its manifest lists (weights, configs, tokenizer files): a request never names a path. Reads and hashing
run on a small thread pool, never on zenoh's own threads.
"""

import hashlib
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import zenoh
from pydantic import ValidationError

from exo.models.gguf_source import KEPT_GGUF_NAME
from exo.shared.types.common import ModelId, NodeId
from exo.shared.types.model_files import (
    ChunkRequest,
    FileRequestAdapter,
    ManifestFile,
    ManifestRequest,
    ModelManifest,
)

logger = logging.getLogger(__name__)

# What a model directory holds that a peer may need: weights, configs and index, tokenizer and template files, and the
# GGUF an import kept: without it a rank would serve its layers re-quantized to Q8_0 (about twice the GGUF's Q4 bytes
# the placement planned) where the node it copied from serves the file's own blocks.
SERVED_SUFFIXES: Final = (".safetensors", ".json", ".jinja", ".txt", ".model", ".tiktoken", ".jsonl")
SERVED_NAMES: Final = frozenset({KEPT_GGUF_NAME})
MAX_CHUNK_BYTES: Final = 16 * 1024 * 1024
_HASH_BLOCK: Final = 4 * 1024 * 1024


def files_key(root: str, node_id: NodeId) -> str:
    return f"{root}/files/{node_id}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def build_manifest(model_id: ModelId, model_dir: Path) -> ModelManifest:
    """Hash every servable file of `model_dir` (plain files only, no hidden or partial ones)."""
    entries = [
        ManifestFile(name=path.name, size=path.stat().st_size, sha256=sha256_of(path))
        for path in sorted(model_dir.iterdir())
        if path.is_file()
        and not path.is_symlink()
        and not path.name.startswith(".")
        and (path.name.endswith(SERVED_SUFFIXES) or path.name in SERVED_NAMES)
    ]
    return ModelManifest(model_id=model_id, files=tuple(entries))


class ModelFileServer:
    """Answers peers' file requests for the models registered with `serve`."""

    def __init__(self, session: zenoh.Session, root: str, node_id: NodeId, workers: int = 2) -> None:
        self._models: dict[ModelId, Path] = {}
        self._manifests: dict[ModelId, ModelManifest] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="model-files")
        self._queryable = session.declare_queryable(files_key(root, node_id), self._on_query)

    def serve(self, model_id: ModelId, model_dir: Path) -> None:
        """Let peers copy `model_dir` as `model_id`."""
        with self._lock:
            self._models[model_id] = model_dir
            self._manifests.pop(model_id, None)

    def close(self) -> None:
        self._queryable.undeclare()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _on_query(self, query: zenoh.Query) -> None:
        payload = query.payload
        try:
            request = FileRequestAdapter.validate_json(payload.to_bytes() if payload is not None else b"")
        except ValidationError as error:
            query.reply_err(f"not a file request: {error.errors()[0]['msg']}".encode())
            return
        self._pool.submit(self._answer, query, request)

    def _answer(self, query: zenoh.Query, request: ManifestRequest | ChunkRequest) -> None:
        try:
            match request:
                case ManifestRequest(model_id=model_id):
                    query.reply(query.key_expr, self._manifest(model_id).model_dump_json().encode())
                case ChunkRequest():
                    query.reply(query.key_expr, self._chunk(request))
        except LookupError as error:
            query.reply_err(str(error).strip("'").encode())
        except OSError as error:
            logger.warning("cannot send model files to a peer: %s", error)
            query.reply_err(f"the file cannot be read: {error}".encode())
        finally:
            query.drop()

    def _manifest(self, model_id: ModelId) -> ModelManifest:
        with self._lock:
            model_dir = self._models.get(model_id)
            manifest = self._manifests.get(model_id)
        if model_dir is None:
            raise LookupError(f"this node does not serve the files of model {model_id}")
        if manifest is None:
            manifest = build_manifest(model_id, model_dir)
            with self._lock:
                self._manifests[model_id] = manifest
        return manifest

    def _chunk(self, request: ChunkRequest) -> bytes:
        manifest = self._manifest(request.model_id)
        entry = manifest.file(request.name)
        if entry is None:
            raise LookupError(f"model {request.model_id} has no file {json.dumps(request.name)}")
        with self._lock:
            path = self._models[request.model_id] / entry.name
        with path.open("rb") as file:
            file.seek(request.offset)
            return file.read(min(request.length, MAX_CHUNK_BYTES))
