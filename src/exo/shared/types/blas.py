"""Which BLAS a runner computes its float32 matmuls with, and how fast it measured: shown in /state."""

from typing import Literal

from exo.shared.types.common import FrozenModel

BlasKind = Literal["openblas", "mkl", "blis", "accelerate", "reference", "other"]
"""The library family. `reference` is the unoptimized netlib BLAS bundled with mlx-cpu."""

BlasSource = Literal["system", "pypi", "bundled"]
"""`system`: installed by the OS package manager; `pypi`: a wheel installed with exo (the `mkl` dependency);
`bundled`: what mlx itself ships (the reference BLAS on Linux)."""

MklThreading = Literal["GNU", "INTEL", "SEQUENTIAL", "TBB"]
"""Values of `MKL_THREADING_LAYER`: which threading runtime MKL uses (GNU = libgomp, INTEL = libiomp5)."""


class BlasReport(FrozenModel):
    """What the runner found after loading mlx: the library `cblas_sgemm` resolves to and its measured speed."""

    kind: BlasKind
    source: BlasSource
    # The shared library file, when it could be located (None for mlx's bundled reference BLAS).
    library: str | None
    # MKL's threading layer; None for every other library.
    threading: MklThreading | None = None
    # Best float32 `matmul_size`×`matmul_size` matmul throughput on the CPU during a short self-check at load time.
    matmul_gflops: float
    matmul_size: int

    def describe(self) -> str:
        """One line for the log: `mkl from pypi (GNU threads, /…/libmkl_rt.so.3): 131 GFLOP/s float32 matmul`."""
        details = [f"{self.threading} threads"] if self.threading else []
        if self.library:
            details.append(self.library)
        suffix = f" ({', '.join(details)})" if details else ""
        return f"{self.kind} from {self.source}{suffix}: {self.matmul_gflops:.0f} GFLOP/s float32 matmul"
