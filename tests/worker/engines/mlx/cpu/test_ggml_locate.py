"""Finding ggml's CPU libraries: `$EXO_GGML_DIR` first, then `exo ggml build`'s cache under `$EXO_HOME` (keyed by
this kind of CPU), then a source checkout's llama.cpp build; the messages name the build command."""

from pathlib import Path

import pytest

from exo.worker.engines.mlx.cpu.ggml_locate import (
    GGML_BUILD_COMMAND,
    GGML_DIR_VARIABLE,
    GGML_LIBRARIES,
    cpu_features,
    cpu_key,
    find_ggml_library,
    ggml_cache_dir,
    ggml_candidates,
    ggml_missing_reason,
    holds_ggml,
)
from exo.worker.engines.mlx.cpu.llama_cpp_source import VERSION, llama_server_bin_dir

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 fma f16c avx
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse2 avx2 fma f16c avx
"""
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd asimddp sve\nCPU implementer\t: 0x41\n"


def put_libraries(folder: Path, names: tuple[str, ...] = GGML_LIBRARIES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"\x7fELF")
    return folder


@pytest.fixture(autouse=True)
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with an empty `$EXO_HOME` (tmp_path/home) and `$EXO_GGML_DIR` unset."""
    monkeypatch.setenv("EXO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(GGML_DIR_VARIABLE, raising=False)


def fake_checkout(tmp_path: Path) -> Path:
    """A source checkout's `build/llama-cpp` (the checkout is recognised by its pyproject.toml)."""
    checkout = tmp_path / "checkout"
    (checkout / "build" / "llama-cpp").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("[project]\n")
    return checkout / "build" / "llama-cpp"


def test_cpu_features_are_the_first_processors_flags_sorted() -> None:
    assert cpu_features(X86_CPUINFO) == ["avx", "avx2", "f16c", "fma", "fpu", "sse2"]
    assert cpu_features(ARM_CPUINFO) == ["asimd", "asimddp", "fp", "sve"]
    assert cpu_features("") == []


def test_cpu_key_changes_with_the_instruction_set_only() -> None:
    key = cpu_key(X86_CPUINFO, "x86_64")
    assert key.startswith("x86_64-")
    assert len(key) == len("x86_64-") + 12
    reordered = X86_CPUINFO.replace("fpu sse2 avx2", "avx2 fpu sse2", 1)
    assert cpu_key(reordered, "x86_64") == key
    assert cpu_key(X86_CPUINFO.replace(" avx2", "", 1), "x86_64") != key  # a CPU without AVX2 gets its own build
    assert cpu_key(ARM_CPUINFO, "aarch64").startswith("aarch64-")
    assert cpu_key() == cpu_key()  # this machine's, read from /proc/cpuinfo (or the processor's name)


def test_the_cache_is_under_exo_home_per_version_and_cpu(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert ggml_cache_dir(key="x86_64-abc") == home / "ggml" / VERSION / "x86_64-abc" / "lib"
    assert ggml_cache_dir() == home / "ggml" / VERSION / cpu_key() / "lib"


def test_nothing_built_names_the_build_command_and_the_places_looked(tmp_path: Path) -> None:
    root = fake_checkout(tmp_path)
    assert find_ggml_library(root) is None
    reason = ggml_missing_reason(root)
    assert GGML_BUILD_COMMAND in reason
    assert str(ggml_cache_dir()) in reason
    assert str(llama_server_bin_dir(root)) in reason


def test_the_build_cache_is_found(tmp_path: Path) -> None:
    built = put_libraries(ggml_cache_dir())
    assert find_ggml_library(fake_checkout(tmp_path)) == built


def test_one_library_alone_is_not_a_build(tmp_path: Path) -> None:
    put_libraries(ggml_cache_dir(), GGML_LIBRARIES[:1])
    assert not holds_ggml(ggml_cache_dir())
    assert find_ggml_library(fake_checkout(tmp_path)) is None


def test_another_cpus_build_is_not_taken(tmp_path: Path) -> None:
    put_libraries(ggml_cache_dir(key="x86_64-000000000000"))
    assert find_ggml_library(fake_checkout(tmp_path)) is None


def test_the_checkouts_llama_cpp_build_comes_after_the_cache(tmp_path: Path) -> None:
    root = fake_checkout(tmp_path)
    bench_build = put_libraries(llama_server_bin_dir(root))
    assert find_ggml_library(root) == bench_build
    cached = put_libraries(ggml_cache_dir())
    assert find_ggml_library(root) == cached


def test_a_llama_cpp_build_outside_a_checkout_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "site-packages" / "build" / "llama-cpp"  # no pyproject.toml above it
    put_libraries(llama_server_bin_dir(root))
    assert ggml_candidates(root) == [ggml_cache_dir()]
    assert find_ggml_library(root) is None


def test_exo_ggml_dir_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put_libraries(ggml_cache_dir())
    own = put_libraries(tmp_path / "my ggml")
    monkeypatch.setenv(GGML_DIR_VARIABLE, str(own))
    assert find_ggml_library(fake_checkout(tmp_path)) == own


def test_exo_ggml_dir_without_the_libraries_is_reported_not_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_libraries(ggml_cache_dir())
    monkeypatch.setenv(GGML_DIR_VARIABLE, str(tmp_path / "empty"))
    assert find_ggml_library() is None
    reason = ggml_missing_reason()
    assert f"{GGML_DIR_VARIABLE}={tmp_path / 'empty'}" in reason
    assert GGML_BUILD_COMMAND in reason
