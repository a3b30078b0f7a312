"""The BLAS fast path: which library is chosen, how the runner's environment carries it, and what the runner finds."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from exo.worker.engines.mlx.cpu import blas, blas_check

LINUX_X86_64 = sys.platform.startswith("linux") and platform.machine() == "x86_64"


def _install_fake_library(directory: Path, name: str) -> Path:
    library = directory / name
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(b"")
    return library


@pytest.fixture
def linux_with_library_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Linux machine whose only library directory is an empty temporary folder and with no PyPI MKL."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "LIBRARY_DIRS", (tmp_path / "system",))
    monkeypatch.setattr(blas, "find_pypi_mkl", lambda: None)
    return tmp_path / "system"


def _with_pypi_mkl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wheel_library = _install_fake_library(tmp_path / "venv" / "lib", "libmkl_rt.so.3")
    monkeypatch.setattr(blas, "find_pypi_mkl", lambda: wheel_library)
    return wheel_library


def test_finds_nothing_when_no_optimized_blas_is_installed(linux_with_library_dir: Path) -> None:
    _install_fake_library(linux_with_library_dir, "libblas.so.3")  # possibly the reference BLAS: not a candidate

    assert blas.choose_blas({}) is None
    assert blas.blas_environment({"PATH": "/bin"}) == {"PATH": "/bin"}


def test_a_system_openblas_comes_first_then_the_pypi_mkl_then_a_system_blis(
    linux_with_library_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blis = _install_fake_library(linux_with_library_dir, "libblis.so.4")
    assert blas.choose_blas({}) == blas.BlasChoice(kind="blis", source="system", library=blis)

    system_mkl = _install_fake_library(linux_with_library_dir, "libmkl_rt.so.2")
    assert blas.choose_blas({}) == blas.BlasChoice(kind="mkl", source="system", library=system_mkl, threading="INTEL")

    wheel_mkl = _with_pypi_mkl(tmp_path, monkeypatch)
    assert blas.choose_blas({}) == blas.BlasChoice(kind="mkl", source="pypi", library=wheel_mkl, threading="INTEL")

    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    threaded = _install_fake_library(linux_with_library_dir, "openblas-pthread/libopenblas.so.0")
    assert blas.choose_blas({}) == blas.BlasChoice(kind="openblas", source="system", library=threaded)


def test_the_search_path_variable_replaces_the_system_folders(
    linux_with_library_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    elsewhere = _install_fake_library(tmp_path / "opt", "libopenblas.so.0")
    wheel_mkl = _with_pypi_mkl(tmp_path, monkeypatch)

    assert blas.choose_blas({blas.SEARCH_PATH_VARIABLE: str(tmp_path / "opt")}) == blas.BlasChoice(
        kind="openblas", source="system", library=elsewhere
    )
    no_system = blas.choose_blas({blas.SEARCH_PATH_VARIABLE: ""})
    assert no_system is not None
    assert (no_system.kind, no_system.source, no_system.library) == ("mkl", "pypi", wheel_mkl)


def test_mkl_threading_is_intel_unless_the_user_chose_a_valid_layer() -> None:
    assert blas.mkl_threading({}) == "INTEL"
    assert blas.mkl_threading({"MKL_THREADING_LAYER": "gnu"}) == "GNU"
    assert blas.mkl_threading({"MKL_THREADING_LAYER": "bogus"}) == "INTEL"


@pytest.mark.usefixtures("linux_with_library_dir")
def test_environment_preloads_mkl_with_its_threading_and_lp64_interface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel_mkl = _with_pypi_mkl(tmp_path, monkeypatch)
    base = {"PATH": "/bin"}

    environment = blas.blas_environment(base)

    assert environment == {
        "PATH": "/bin",
        "LD_PRELOAD": str(wheel_mkl),
        "MKL_THREADING_LAYER": "INTEL",
        "MKL_INTERFACE_LAYER": "LP64",
    }
    assert base == {"PATH": "/bin"}  # the caller's mapping is not modified
    users = blas.blas_environment({"MKL_THREADING_LAYER": "TBB"})
    assert users["MKL_THREADING_LAYER"] == "TBB"


def test_macos_never_preloads(linux_with_library_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    monkeypatch.setattr(sys, "platform", "darwin")

    assert blas.choose_blas({}) is None
    assert blas.blas_environment({"PATH": "/bin"}) == {"PATH": "/bin"}
    assert blas.blas_advice({}) is None


def test_environment_keeps_an_existing_preload_first(linux_with_library_dir: Path) -> None:
    library = _install_fake_library(linux_with_library_dir, "libopenblas.so.0")

    environment = blas.blas_environment({"LD_PRELOAD": "/opt/libjemalloc.so /opt/libother.so"})

    assert environment["LD_PRELOAD"] == f"/opt/libjemalloc.so:/opt/libother.so:{library}"
    assert blas.blas_environment(environment) == environment  # preloading twice does not repeat the library


def test_environment_unchanged_when_opted_out(linux_with_library_dir: Path) -> None:
    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    opted_out = {blas.NO_PRELOAD_VARIABLE: "1"}

    assert blas.blas_environment(opted_out) == opted_out
    assert blas.blas_advice(opted_out) is None


def test_advice_only_when_linux_lacks_an_optimized_blas(linux_with_library_dir: Path) -> None:
    advice = blas.blas_advice({})
    assert advice is not None
    assert "libopenblas0-pthread" in advice

    _install_fake_library(linux_with_library_dir, "libopenblas.so.0")
    assert blas.blas_advice({}) is None


def test_libraries_are_classified_by_family_and_origin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel_mkl = _with_pypi_mkl(tmp_path, monkeypatch)
    assert blas.classify_library(None) == ("reference", "bundled")
    assert blas.classify_library(wheel_mkl) == ("mkl", "pypi")
    assert blas.classify_library(Path("/usr/lib/x86_64-linux-gnu/libmkl_rt.so.2")) == ("mkl", "system")
    assert blas.classify_library(Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3")) == (
        "openblas",
        "system",
    )
    accelerate = Path("/System/Library/Frameworks/Accelerate.framework/Versions/A/Frameworks/vecLib.framework/libBLAS")
    assert blas.classify_library(accelerate) == ("accelerate", "system")


def test_the_node_side_module_does_not_import_mlx() -> None:
    script = "import sys, exo.worker.engines.mlx.cpu.blas; print('mlx.core' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert completed.stdout.strip() == "False"


def test_the_self_check_reports_this_process_and_a_positive_rate() -> None:
    report = blas_check.blas_report(n=64)

    assert report.matmul_size == 64
    assert report.matmul_gflops > 0
    if "LD_PRELOAD" not in os.environ and sys.platform.startswith("linux"):
        assert (report.kind, report.source, report.library) == ("reference", "bundled", None)


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


@pytest.mark.skipif(not LINUX_X86_64, reason="exo preloads a BLAS on Linux only; the PyPI MKL is for x86_64")
def test_preloaded_subprocess_uses_the_optimized_blas_and_computes_the_same_matmul(tmp_path: Path) -> None:
    plain_environment = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    choice = blas.choose_blas(plain_environment)
    assert choice is not None, "Linux x86_64 always has the mkl wheel, a dependency of exo"

    reference, reference_maps = _matmul_in_subprocess(plain_environment, tmp_path / "reference.npy")
    optimized, optimized_maps = _matmul_in_subprocess(blas.blas_environment(plain_environment), tmp_path / "fast.npy")

    loaded = str(choice.library.resolve())
    assert loaded not in reference_maps
    assert loaded in optimized_maps
    assert mx.allclose(optimized, reference, rtol=1e-4, atol=1e-3).item()


@pytest.mark.usefixtures("linux_cpu_machine")
def test_the_preloaded_blas_takes_a_thread_count_in_the_runner_process() -> None:
    """A Q8_0 runner puts the BLAS on one thread (`set_blas_threads`): in a process started as the node starts its
    runners (the optimized BLAS preloaded), the library mlx's matmuls reach then reports that count."""
    environment = blas.blas_environment(dict(os.environ))
    if blas.choose_blas(environment) is None:
        pytest.skip("no optimized BLAS on this machine to preload")
    script = (
        "import ctypes\n"
        "from exo.worker.engines.mlx.cpu.blas_check import set_blas_threads\n"
        "library = set_blas_threads(1)\n"
        "assert library is not None\n"
        "handle = ctypes.CDLL(str(library))\n"
        "count = handle.MKL_Get_Max_Threads() if hasattr(handle, 'MKL_Get_Max_Threads') "
        "else handle.openblas_get_num_threads()\n"
        "print(library.name, count)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True, timeout=120
    )
    assert completed.stdout.split()[-1] == "1"
