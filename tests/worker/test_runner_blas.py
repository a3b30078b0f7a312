"""A real node on a Linux x86_64 machine with no system BLAS: its runner uses the PyPI MKL, and it is fast.

"No system BLAS" is simulated by pointing the system search at nothing (`EXO_BLAS_SEARCH_PATH=`), so the test means
the same on a machine that has OpenBLAS installed. The reference is the same node started with the preload off.
"""

import platform
import sys
from pathlib import Path

import pytest

from exo.worker.engines.mlx.cpu.blas import NO_PRELOAD_VARIABLE, SEARCH_PATH_VARIABLE
from tests.exo_server import fixture_model, running_exo

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
    reason="the PyPI MKL is a dependency on Linux x86_64 only",
)

MINIMUM_SPEED_UP = 5.0


def _runner_blas(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, object], str]:
    tmp_path.mkdir()
    with running_exo([fixture_model("tiny-qwen-tools")], tmp_path, env=env) as server:
        metadata = server.runner()["metadata"]
        assert isinstance(metadata, dict)
        report = metadata["blas"]  # pyright: ignore[reportUnknownVariableType]
        assert isinstance(report, dict)
        return report, server.log()  # pyright: ignore[reportUnknownVariableType]


def test_without_a_system_blas_the_runner_loads_the_pypi_mkl_and_beats_the_reference(tmp_path: Path) -> None:
    fast, fast_log = _runner_blas(tmp_path / "pypi", {SEARCH_PATH_VARIABLE: ""})
    reference, _ = _runner_blas(tmp_path / "reference", {SEARCH_PATH_VARIABLE: "", NO_PRELOAD_VARIABLE: "1"})

    assert (fast["kind"], fast["source"], fast["threading"]) == ("mkl", "pypi", "INTEL")
    library = Path(str(fast["library"]))
    assert library.name.startswith("libmkl_rt.so.")
    # Named by its file only (no install path without --show-model-paths); the wheel's copy is inside this environment.
    assert library == Path(library.name)
    assert any(Path(sys.prefix).rglob(library.name))
    assert (reference["kind"], reference["source"], reference["library"]) == ("reference", "bundled", None)
    fast_rate, reference_rate = float(str(fast["matmul_gflops"])), float(str(reference["matmul_gflops"]))
    assert fast_rate >= MINIMUM_SPEED_UP * reference_rate, (fast, reference)
    # The node logs what its runner uses and how fast, once, when the runner is ready.
    assert fast_log.count("BLAS: mkl from pypi (INTEL threads") == 1
