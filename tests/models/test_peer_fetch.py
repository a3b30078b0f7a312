"""Copying a model from a peer over real zenoh sessions on 127.0.0.1: only a rank's files, checked, atomic."""

import json
import shutil
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zenoh

from exo.models.gguf_source import kept_gguf, record_gguf
from exo.models.peer_fetch import PeerFetchError, PeerFiles, fetch_model_files
from exo.models.peer_files import ModelFileServer, files_key
from exo.shared.types.common import ModelId, NodeId
from exo.shared.types.preparation import ProgressUpdate
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.ports import free_port

ROOT = "exo/test/v1"
MODEL = ModelId("tiny-qwen-tools-deep")
SERVER = NodeId("server-node")


def _session(listen: str | None, connect: str | None) -> zenoh.Session:
    config = zenoh.Config()
    config.insert_json5("mode", '"peer"')
    config.insert_json5("listen/endpoints", json.dumps([listen] if listen else []))
    config.insert_json5("connect/endpoints", json.dumps([connect] if connect else []))
    config.insert_json5("scouting/multicast/enabled", "false")
    return zenoh.open(config)


def _wait_until_reachable(client: zenoh.Session) -> None:
    """The sessions connect (and the queryable's declaration reaches the client) shortly after opening."""
    deadline = time.monotonic() + 30
    while not list(client.get(files_key(ROOT, SERVER), payload=b"{}", timeout=1)):
        assert time.monotonic() < deadline, "the two sessions never connected"
        time.sleep(0.1)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    copy = tmp_path / "source" / MODEL
    shutil.copytree(FIXTURE_MODELS_DIR / MODEL, copy)
    return copy


@contextmanager
def _serving(source: Path) -> Generator[tuple[ModelFileServer, zenoh.Session]]:
    """A file server with `source` registered, and a client session that reaches it."""
    endpoint = f"tcp/127.0.0.1:{free_port()}"
    server_session = _session(endpoint, None)
    client_session = _session(None, endpoint)
    server = ModelFileServer(server_session, ROOT, SERVER)
    try:
        server.serve(MODEL, source)
        _wait_until_reachable(client_session)
        yield server, client_session
    finally:
        server.close()
        client_session.close()
        server_session.close()


@pytest.fixture
def sessions(source: Path) -> Iterator[tuple[ModelFileServer, zenoh.Session]]:
    with _serving(source) as served:
        yield served


def test_a_rank_fetches_its_layer_files_and_the_shared_ones_intact(
    sessions: tuple[ModelFileServer, zenoh.Session], source: Path, tmp_path: Path
) -> None:
    _, client = sessions
    target = tmp_path / "target"
    updates: list[ProgressUpdate] = []
    copied = fetch_model_files(PeerFiles(client, ROOT, SERVER, MODEL), target, 3, 4, updates.append)
    weight_map = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    layer_3 = weight_map["model.layers.3.mlp.up_proj.weight"]
    shared = weight_map["model.embed_tokens.weight"]
    weights = sorted(name for name in copied if name.endswith(".safetensors"))
    assert weights == sorted({layer_3, shared})
    assert {path.name for path in target.iterdir()} == {
        path.name for path in source.iterdir() if not path.name.endswith(".safetensors")
    } | {layer_3, shared}
    for path in target.iterdir():
        assert path.read_bytes() == (source / path.name).read_bytes()
    assert updates[-1].done_bytes == updates[-1].total_bytes > 0
    # Everything is there now: a second fetch copies nothing; another rank's layers come on top.
    assert fetch_model_files(PeerFiles(client, ROOT, SERVER, MODEL), target, 3, 4) == []
    assert fetch_model_files(PeerFiles(client, ROOT, SERVER, MODEL), target, 0, 1) == [
        weight_map["model.layers.0.mlp.up_proj.weight"]
    ]


def test_a_rank_copies_the_gguf_an_import_kept_and_no_other(tmp_path: Path, source: Path) -> None:
    """Without the kept GGUF a rank would serve its layers as Q8_0 where the node it copied from serves the file's
    blocks; any other .gguf (a user's stray file) stays behind."""
    scratch = tmp_path / "scratch.gguf"
    scratch.write_bytes(bytes(range(256)) * 4096)
    record_gguf(source, scratch, {}, move=True)  # as a catalog import keeps it: model.gguf and its record
    (source / "other.gguf").write_bytes(b"not served")
    with _serving(source) as (_, client):  # registered after the files are written: its manifest lists them
        copied = fetch_model_files(PeerFiles(client, ROOT, SERVER, MODEL), tmp_path / "target", 3, 4)
    assert "model.gguf" in copied
    assert "other.gguf" not in copied
    assert (tmp_path / "target" / "model.gguf").read_bytes() == (source / "model.gguf").read_bytes()
    # The copy is the GGUF its record names (a new file's own time would not be): the rank serves its blocks.
    assert kept_gguf(tmp_path / "target") == tmp_path / "target" / "model.gguf"


def test_a_file_that_does_not_match_its_checksum_is_not_kept(
    sessions: tuple[ModelFileServer, zenoh.Session], source: Path, tmp_path: Path
) -> None:
    _, client = sessions
    peer = PeerFiles(client, ROOT, SERVER, MODEL)
    peer.manifest()  # hashed now; the file changes under it afterwards
    weights = sorted(source.glob("model-*.safetensors"))
    data = bytearray(weights[-1].read_bytes())
    data[-1] ^= 0xFF
    weights[-1].write_bytes(bytes(data))
    target = tmp_path / "target"
    with pytest.raises(PeerFetchError, match="does not match its sha256"):
        fetch_model_files(peer, target, 0, None)
    assert not (target / weights[-1].name).exists()
    assert not any(path.name.endswith(".partial") for path in target.iterdir())


def test_only_registered_models_and_their_listed_files_are_served(
    sessions: tuple[ModelFileServer, zenoh.Session],
) -> None:
    _, client = sessions
    with pytest.raises(PeerFetchError, match="does not serve the files of model other"):
        PeerFiles(client, ROOT, SERVER, ModelId("other")).manifest()
    with pytest.raises(PeerFetchError, match=r"has no file \"../config.json\""):
        PeerFiles(client, ROOT, SERVER, MODEL).chunk("../config.json", 0, 10)
    replies = list(client.get(files_key(ROOT, SERVER), payload=b'{"kind": "format_disk"}', timeout=10))
    assert [reply.err is not None for reply in replies] == [True]
