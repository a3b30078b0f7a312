"""Which BLAS a runner computes its float32 matmuls with, and how fast it measured: shown in /state."""

from typing import Literal

from pydantic import Field

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


class MatmulPlanReport(FrozenModel):
    """How the runner computes the few-row float32 products of decoding (see `engines/mlx/cpu/matmul_plan.py`)."""

    # Seconds spent timing the candidate layouts after the model loaded.
    measured_seconds: float
    # Weight shapes with a plan; smaller ones keep mlx's own product.
    planned_shapes: int
    # For each number of rows (sequences times tokens in one forward pass): mlx's own layout's time over the planned
    # products divided by the plan's, as measured. 1.0 where mlx's own layout stayed the choice.
    speedup_by_rows: dict[int, float]
    # For each number of rows the plan changes and whole forward passes have checked it (the runner does while
    # idle): mlx's own products' pass time divided by the planned pass time. Where it was not above 1.0, mlx's own
    # products serve that row count, and `speedup_by_rows` says 1.0 there.
    pass_speedup_by_rows: dict[int, float] = Field(default_factory=dict[int, float])

    def describe(self) -> str:
        """One line for the log: `planned 5 weight shapes in 1.6 s; products over 1/2/3 rows 1.31/1.12/1.87x faster
        than mlx's own layout; whole passes over 1/2/3 rows 1.12/1.05/0.97x faster with the plan`."""
        described = (
            f"planned {self.planned_shapes} weight shapes in {self.measured_seconds:.1f} s; "
            f"products over {_by_rows(self.speedup_by_rows)}x faster than mlx's own layout"
        )
        if self.pass_speedup_by_rows:
            described += f"; whole passes over {_by_rows(self.pass_speedup_by_rows)}x faster with the plan"
        return described


def _by_rows(speedups: dict[int, float]) -> str:
    """`1/2/3 rows 1.31/1.12/1.87`."""
    rows = "/".join(str(count) for count in speedups)
    return f"{rows} rows " + "/".join(f"{speedup:.2f}" for speedup in speedups.values())
