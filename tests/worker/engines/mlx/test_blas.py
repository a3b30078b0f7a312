"""The BLAS fast path: which library is chosen, how the runner's environment carries it, and that it computes right."""

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from exo.worker.engines.mlx import blas


def _install_fake_library(directory: Path, name: str) -> Path:
    library = directory / name
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(b"")
    return library


@pytest.fixture
def linux_with_library_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Linux machine whose only library directory is an empty temporary folder."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "LIBRARY_DIRS", (tmp_path,))
    return tmp_path


def test_finds_nothing_when_no_optimized_blas_is_installed(linux_with_library_dir: Path) -> None:
    _install_fake_library(linux_with_library_dir, "libblas.so.3")  # possibly the reference BLAS: not a candidate

    assert blas.find_optimized_blas() is None


def test_prefers_threaded_openblas_over_other_libraries(linux_with_library_dir: Path) -> None:
    _install_fake_library(linux_with_library_dir, "libblis.so.4")
    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    threaded = _install_fake_library(linux_with_library_dir, "openblas-pthread/libopenblas.so.0")

    assert blas.find_optimized_blas() == threaded


def test_finds_blis_or_mkl_when_openblas_is_absent(linux_with_library_dir: Path) -> None:
    mkl = _install_fake_library(linux_with_library_dir, "libmkl_rt.so.2")
    assert blas.find_optimized_blas() == mkl

    blis = _install_fake_library(linux_with_library_dir, "libblis.so.4")
    assert blas.find_optimized_blas() == blis


def test_macos_never_preloads(linux_with_library_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    monkeypatch.setattr(sys, "platform", "darwin")

    assert blas.find_optimized_blas() is None
    assert blas.blas_environment({"PATH": "/bin"}) == {"PATH": "/bin"}
    assert blas.blas_advice() is None
    assert blas.preferred_compute_dtype() is None


def test_environment_preloads_the_found_library(linux_with_library_dir: Path) -> None:
    library = _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    base = {"PATH": "/bin"}

    environment = blas.blas_environment(base)

    assert environment == {"PATH": "/bin", "LD_PRELOAD": str(library)}
    assert base == {"PATH": "/bin"}  # the caller's mapping is not modified


def test_environment_keeps_an_existing_preload_first(linux_with_library_dir: Path) -> None:
    library = _install_fake_library(linux_with_library_dir, "libopenblas.so.0")

    environment = blas.blas_environment({"LD_PRELOAD": "/opt/libjemalloc.so /opt/libother.so"})

    assert environment["LD_PRELOAD"] == f"/opt/libjemalloc.so:/opt/libother.so:{library}"
    assert blas.blas_environment(environment) == environment  # preloading twice does not repeat the library


def test_environment_unchanged_when_opted_out_or_nothing_found(linux_with_library_dir: Path) -> None:
    assert blas.blas_environment({"LD_PRELOAD": "/opt/a.so"}) == {"LD_PRELOAD": "/opt/a.so"}

    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    opted_out = {blas.NO_PRELOAD_VARIABLE: "1"}
    assert blas.blas_environment(opted_out) == opted_out


def test_advice_only_when_linux_lacks_an_optimized_blas(linux_with_library_dir: Path) -> None:
    advice = blas.blas_advice()
    assert advice is not None
    assert "libopenblas0-pthread" in advice

    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    assert blas.blas_advice() is None


def test_compute_dtype_is_float32_on_a_linux_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")

    with mx.stream(mx.cpu):
        assert blas.preferred_compute_dtype() == mx.float32


def test_matmul_self_check_reports_a_positive_rate() -> None:
    assert blas.measure_matmul_gflops(n=64) > 0


_MATMUL_SCRIPT = """
import sys
import mlx.core as mx
left = mx.random.normal((384, 384), key=mx.random.key(0))
right = mx.random.normal((384, 384), key=mx.random.key(1))
mx.save(sys.argv[1], mx.matmul(left, right, stream=mx.cpu))
with open("/proc/self/maps") as maps:
    print(maps.read())
"""


def _matmul_in_subprocess(environment: dict[str, str], output: Path) -> tuple[mx.array, str]:
    """Run a float32 matmul in a fresh interpreter; returns its result and its memory map (the loaded libraries)."""
    completed = subprocess.run(
        [sys.executable, "-c", _MATMUL_SCRIPT, str(output)],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = mx.load(str(output))
    assert isinstance(result, mx.array)
    return result, completed.stdout


@pytest.mark.skipif(blas.find_optimized_blas() is None, reason="no optimized BLAS installed on this machine")
def test_preloaded_subprocess_uses_the_optimized_blas_and_computes_the_same_matmul(tmp_path: Path) -> None:
    library = blas.find_optimized_blas()
    assert library is not None
    plain_environment = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}

    reference, reference_maps = _matmul_in_subprocess(plain_environment, tmp_path / "reference.npy")
    optimized, optimized_maps = _matmul_in_subprocess(blas.blas_environment(plain_environment), tmp_path / "fast.npy")

    loaded = str(library.resolve())
    assert loaded not in reference_maps
    assert loaded in optimized_maps
    assert mx.allclose(optimized, reference, rtol=1e-4, atol=1e-3).item()
