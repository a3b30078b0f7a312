"""Which checkpoint files a pipeline rank needs: the files holding its layers, plus those holding the weights outside
any layer (embeddings, final norm, output head).

A checkpoint split over several safetensors files lists in `model.safetensors.index.json` which file holds each
weight; a rank needs only the files its layers (and the shared weights) are in. A checkpoint without that index does
not split: every rank needs all of its weight files. No MLX here: a node decides what to fetch before loading.
"""

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final, cast

WEIGHT_INDEX_FILE: Final = "model.safetensors.index.json"
WEIGHT_FILE_PATTERN: Final = "model*.safetensors"
# Weight names such as "model.layers.12.mlp.up_proj.weight" (the pattern mlx-lm's own sharded loading matches).
_LAYER_NUMBER: Final = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def read_weight_map(model_dir: Path) -> dict[str, str] | None:
    """The index's weight name → file map, or None when the checkpoint has no index."""
    index = model_dir / WEIGHT_INDEX_FILE
    if not index.is_file():
        return None
    document: object = json.loads(index.read_text())
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index} has no weight_map")
    return {str(name): str(file) for name, file in cast(dict[object, object], weight_map).items()}


def files_for_layers(weight_map: Mapping[str, str], start: int, end: int) -> tuple[str, ...]:
    """The files of an indexed checkpoint a rank running layers [start, end) needs, sorted."""
    needed: set[str] = set()
    for name, file in weight_map.items():
        match = _LAYER_NUMBER.search(name)
        if match is None or start <= int(match.group(1)) < end:
            needed.add(file)
    return tuple(sorted(needed))


def needed_weight_files(model_dir: Path, start: int, end: int | None) -> tuple[str, ...]:
    """The weight files (names inside `model_dir`) a rank running layers [start, end) must have.

    `end` None means the whole model. Without an index, every weight file present (or `model.safetensors` when
    there is none yet) — such a checkpoint does not split.
    """
    weight_map = read_weight_map(model_dir)
    if weight_map is not None:
        return files_for_layers(weight_map, start, end if end is not None else 1 << 30)
    present = sorted(path.name for path in model_dir.glob(WEIGHT_FILE_PATTERN))
    return tuple(present) or ("model.safetensors",)


def missing_weight_files(model_dir: Path, start: int, end: int | None) -> list[str]:
    """The needed weight files that are not in `model_dir` yet."""
    return [name for name in needed_weight_files(model_dir, start, end) if not (model_dir / name).is_file()]
