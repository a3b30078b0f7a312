"""The tool-call package depends on neither MLX nor HTTP, and `exo conformance` on no MLX: the API process and a
plain install may import them."""

import subprocess
import sys

_HEAVY = ("mlx", "mlx_lm", "transformers", "fastapi", "starlette", "uvicorn", "httpx")


def _loaded_after(imports: str) -> list[str]:
    probe = f"import sys\nimport {imports}\nprint(' '.join(sorted(name for name in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return [name for name in result.stdout.split() if name.split(".")[0] in _HEAVY]


def test_the_tool_call_package_loads_no_mlx_and_no_http_stack() -> None:
    assert _loaded_after("exo.tool_calls, exo.tool_calls.registry, exo.tool_calls.request_grammar") == []


def test_the_conformance_command_loads_no_mlx() -> None:
    loaded = _loaded_after("exo.conformance.cli")
    assert not [name for name in loaded if name.split(".")[0] in ("mlx", "mlx_lm", "transformers")], loaded
