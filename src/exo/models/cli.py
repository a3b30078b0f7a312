"""`exo models`: list the model catalog, or fetch one model ahead of serving it.

`exo models` prints one row per model (id, family, parameters, download, disk, memory, tool format, source,
whether it is downloaded); `--json` prints the same as JSON. The memory is the weights' as a node on this machine
started with the same `--cpu-kernels` and `--cpu-weights` holds them (on a Linux CPU: under the default `auto`, the
GGUF each catalog import keeps where ggml's CPU library is built, else float32; as stored elsewhere).
`exo models download ID` fetches and imports a model with a progress bar, so a later `exo --model ID` starts at once.
"""

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import get_args

from pydantic import TypeAdapter
from rich.filesize import decimal

from exo.models.catalog import (
    CATALOG,
    CatalogListing,
    catalog_held_as,
    catalog_listing,
    describe_size,
    weights_label,
)
from exo.models.catalog_api import NodeCatalogModel
from exo.models.paths import default_models_dir
from exo.models.progress import PreparationTracker
from exo.models.progress_display import ConsoleProgress
from exo.shared.errors import ExoModelError
from exo.shared.local_backend import local_weights_in_memory
from exo.shared.types.common import ModelId
from exo.shared.types.cpu_kernels import DEFAULT_CPU_WEIGHTS, CpuKernelsSetting, CpuWeightsSetting, NodeCpuWeights
from exo.shared.types.footprint import WeightsInMemory

_MODELS_ADAPTER = TypeAdapter(list[NodeCatalogModel])
_HEADERS = ("ID", "FAMILY", "PARAMS", "DOWNLOAD", "DISK", "MEMORY ({weights})", "TOOLS", "SOURCE", "DOWNLOADED")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exo models", description="List or fetch the models exo can serve.")
    parser.add_argument(
        "--models-dir", type=Path, help="where downloaded/imported models live (default $EXO_HOME/models)"
    )
    parser.add_argument("--json", action="store_true", help="print the catalog as JSON")
    parser.add_argument(
        "--cpu-kernels",
        choices=("auto", "off"),
        default="auto",
        help="show memory as a node started with this --cpu-kernels holds the weights (default auto)",
    )
    parser.add_argument(
        "--cpu-weights",
        choices=get_args(CpuWeightsSetting),
        default=DEFAULT_CPU_WEIGHTS,
        help=f"show memory as a node started with this --cpu-weights holds the weights (default {DEFAULT_CPU_WEIGHTS}: "
        "the GGUF each catalog import keeps where ggml's CPU library is built, else float32)",
    )
    commands = parser.add_subparsers(dest="command")
    download = commands.add_parser("download", help="fetch and import a catalog model now")
    download.add_argument("model", choices=[entry.model_id for entry in CATALOG], help="the model id")
    download.add_argument(
        "--force",
        action="store_true",
        help="import it again even if it is there (a model imported before exo kept its GGUF, which "
        "--cpu-weights gguf serves)",
    )
    return parser


def _source(listing: CatalogListing) -> str:
    source = listing.entry.source
    first, last = source.pieces[0].distribution, source.pieces[-1].distribution
    shared = first.rstrip("0123456789")
    span = f"{shared}{first.removeprefix(shared)}..{last.removeprefix(shared)}"
    return f"PyPI {span}" + (" (installed with exo)" if source.installed_with_exo else "")


def _row(model: NodeCatalogModel) -> tuple[str, ...]:
    listing = model.listing
    entry = listing.entry
    download = "-" if entry.source.installed_with_exo else decimal(entry.source.download_bytes)
    return (
        entry.model_id,
        entry.family,
        entry.parameters,
        download,
        decimal(entry.disk_bytes),
        decimal(model.memory_bytes),
        entry.tool_format.value,
        _source(listing),
        "yes" if listing.downloaded else "no",
    )


def format_table(models: Sequence[NodeCatalogModel], weights: WeightsInMemory) -> str:
    """The catalog as an aligned text table, one model per row; the memory column names how weights are held."""
    headers = tuple(header.format(weights=weights.upper()) for header in _HEADERS)
    rows = [headers, *(_row(model) for model in models)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_HEADERS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _download(model_id: ModelId, models_dir: Path, weights: WeightsInMemory, *, force: bool = False) -> int:
    from exo.models.catalog_fetch import fetch_catalog_model  # the converter's imports are heavy: only here

    console = ConsoleProgress(sys.stderr)
    tracker = PreparationTracker(model_id, (console,))
    entry = next(entry for entry in CATALOG if entry.model_id == model_id)
    print(f"{model_id}: {describe_size(entry, weights)}", file=sys.stderr)
    try:
        path = fetch_catalog_model(model_id, models_dir, tracker, force=force)
    except ExoModelError as error:
        console.close()
        print(f"exo models: {error}", file=sys.stderr)
        return 1
    tracker.finish()
    console.close()
    print(path)
    return 0


MachineWeights = Callable[[CpuWeightsSetting, CpuKernelsSetting], tuple[NodeCpuWeights, str | None]]
"""How a node on this machine would hold weights under `--cpu-weights`/`--cpu-kernels` (`auto` resolved), and the note
`auto` gives where ggml's library is missing. Passed in by `exo` (the worker's ggml lookup), so this package never
imports the worker's."""


def main(argv: Sequence[str], machine_weights: MachineWeights) -> int:
    """Run `exo models` with `argv` (the arguments after `models`); returns the exit status."""
    arguments = build_parser().parse_args(argv)
    models_dir: Path = arguments.models_dir or default_models_dir()
    node, note = machine_weights(arguments.cpu_weights, arguments.cpu_kernels)
    weights = catalog_held_as(local_weights_in_memory(arguments.cpu_kernels, node))
    if arguments.command == "download":
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per piece fetched: noise here
        return _download(ModelId(arguments.model), models_dir, weights, force=arguments.force)
    models = [NodeCatalogModel.of(listing, weights) for listing in catalog_listing(models_dir)]
    if arguments.json:
        print(_MODELS_ADAPTER.dump_json(models, indent=2).decode())
    else:
        print(format_table(models, weights))
        print(
            f"\nmodels directory: {models_dir}; memory is the weights held as {weights_label(weights)} "
            f"(--cpu-kernels {arguments.cpu_kernels} --cpu-weights {arguments.cpu_weights} on this machine), "
            "before the KV cache",
            file=sys.stderr,
        )
        if note is not None:
            print(note, file=sys.stderr)
    return 0
