"""What nodes exchange to copy a model's files from one to another over the cluster."""

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from exo.shared.types.common import FrozenModel, ModelId


class ManifestFile(FrozenModel):
    name: str
    size: int
    sha256: str


class ModelManifest(FrozenModel):
    """Every file of a model directory a peer can send, with its size and checksum."""

    model_id: ModelId
    files: tuple[ManifestFile, ...]

    def file(self, name: str) -> ManifestFile | None:
        return next((entry for entry in self.files if entry.name == name), None)


class ManifestRequest(FrozenModel):
    kind: Literal["manifest"] = "manifest"
    model_id: ModelId


class ChunkRequest(FrozenModel):
    """Bytes [offset, offset + length) of one file of the manifest."""

    kind: Literal["chunk"] = "chunk"
    model_id: ModelId
    name: str
    offset: int = Field(ge=0)
    length: int = Field(gt=0)


FileRequest = Annotated[ManifestRequest | ChunkRequest, Field(discriminator="kind")]
FileRequestAdapter: TypeAdapter[FileRequest] = TypeAdapter(FileRequest)
