"""A runner's load failure names the fix for a known set-up mistake: mlx's CUDA build without an NVIDIA driver, or no
mlx backend at all."""

from exo.worker.runner.runner import NO_MLX_BACKEND, NO_NVIDIA_DRIVER, load_failure_reason


def test_the_cuda_build_without_a_driver_names_the_fix() -> None:
    # What `import mlx.core` raises with mlx-cuda-13 installed on a machine without the driver (seen on this CPU box).
    error = ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")
    reason = load_failure_reason(error)
    assert reason.startswith("ImportError: libcuda.so.1: cannot open shared object file")
    assert NO_NVIDIA_DRIVER in reason
    assert "a plain `uv run exo`" in reason


def test_no_backend_at_all_names_the_fix() -> None:
    # What `import mlx.core` raises with neither mlx-cpu nor mlx-cuda installed (`--no-group cpu` alone; seen here).
    reason = load_failure_reason(ImportError("libmlx.so: cannot open shared object file: No such file or directory"))
    assert NO_MLX_BACKEND in reason
    assert NO_NVIDIA_DRIVER not in reason


def test_other_failures_are_reported_as_they_are() -> None:
    assert load_failure_reason(ValueError("no weights in /models/x")) == "ValueError: no weights in /models/x"
    other = load_failure_reason(ImportError("No module named 'mlx_lm'"))
    assert other == "ImportError: No module named 'mlx_lm'"
