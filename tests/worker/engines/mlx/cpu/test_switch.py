"""The one setting: `off` serves stock mlx-lm (its logits equal mlx-lm's own), `auto` on a Linux CPU applies every
replacement (the logits within float32 rounding), a replaced function whose signature changed turns its replacement
off with a warning, and on any other platform (faked here) nothing is replaced and the CPU-only tests skip.

The logits are compared in fresh processes (`logits_probe.py`): the numpy kernels re-point mlx-lm's modules for the
whole process, so stock mlx-lm must run where exo has not been imported.
"""

import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx import nn

from exo.shared.types.cpu_kernels import REPLACEMENTS, CpuKernelsReport
from exo.worker.engines.mlx.cpu import blas, machine, signatures
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.cpu.signatures import WrittenFor, mismatches
from exo.worker.engines.mlx.cpu.switch import why_off
from tests.worker.engines.mlx.cpu.platform_gate import require_linux_cpu

REPO_ROOT = Path(__file__).resolve().parents[5]


def _probe(mode: str) -> tuple[dict[str, object], str]:
    result = subprocess.run(
        [sys.executable, "-m", "tests.worker.engines.mlx.cpu.logits_probe", mode],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def _report(probed: dict[str, object]) -> CpuKernelsReport:
    return CpuKernelsReport.model_validate(probed["report"])


def _is_on(report: CpuKernelsReport, name: str) -> bool:
    return any(state.name == name and state.on for state in report.replacements)


def test_off_serves_stock_mlx_lm_with_its_very_logits() -> None:
    probed, _ = _probe("off")
    assert probed["max_difference"] == 0.0
    assert probed["dtype"] == "native"
    assert probed["stock_attention"] is True
    assert probed["stock_swiglu"] is True
    report = _report(probed)
    assert not any(_is_on(report, name) for name in REPLACEMENTS)
    assert report.describe() == "off: all off (--cpu-kernels off): stock mlx-lm"


@pytest.mark.usefixtures("linux_cpu_machine")
def test_auto_on_a_linux_cpu_replaces_and_matches_stock_logits_within_float32_rounding() -> None:
    probed, _ = _probe("auto")
    difference = probed["max_difference"]
    assert isinstance(difference, float)
    assert 0.0 < difference < 1e-4  # the numpy kernels ran (not bit-identical), and agree to float32 rounding
    assert probed["same_argmax"] is True
    assert probed["dtype"] == "float32"
    assert probed["stock_attention"] is False
    assert probed["stock_swiglu"] is False
    report = _report(probed)
    assert all(_is_on(report, name) for name in ("float32", "numpy_attention", "numpy_swiglu", "matmul_plan"))


@pytest.mark.usefixtures("linux_cpu_machine")
def test_a_changed_signature_turns_that_replacement_off_with_a_warning() -> None:
    probed, stderr = _probe("changed-swiglu")
    assert "CPU kernels: numpy_swiglu turned off: mlx_lm.models.activations.swiglu is (gate, x, *, alpha=1.0)" in stderr
    report = _report(probed)
    assert not _is_on(report, "numpy_swiglu")
    assert _is_on(report, "numpy_attention")
    assert probed["stock_swiglu"] is True
    assert probed["stock_attention"] is False
    assert probed["same_argmax"] is True


def test_this_mlx_lm_has_the_signatures_the_replacements_were_written_for() -> None:
    assert signatures.MISMATCHES == {}


def test_a_missing_or_changed_function_is_named_in_the_warning(caplog: pytest.LogCaptureFixture) -> None:
    def swiglu(gate: mx.array, x: mx.array, y: mx.array) -> mx.array:
        return gate * x * y

    owner = SimpleNamespace(__name__="fake_mlx_lm", swiglu=swiglu)
    written = (
        WrittenFor("numpy_swiglu", owner, "swiglu", "(gate, x)"),
        WrittenFor("numpy_attention", owner, "scaled_dot_product_attention", "(queries)"),
    )
    with caplog.at_level(logging.WARNING):
        found = mismatches(written)
    assert found == {
        "numpy_swiglu": "fake_mlx_lm.swiglu is (gate, x, y), written for (gate, x)",
        "numpy_attention": "fake_mlx_lm.scaled_dot_product_attention is missing, written for (queries)",
    }
    assert "numpy_swiglu turned off" in caplog.text
    assert "numpy_attention turned off" in caplog.text


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_elsewhere_than_linux_every_replacement_is_off(monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    monkeypatch.setattr(sys, "platform", platform)
    assert not machine.linux_cpu()
    assert why_off("auto") == "not a Linux CPU machine"
    assert blas.choose_blas({}) is None
    kernels = CpuKernels("auto", environment={})
    model = nn.Linear(4, 4)
    model.set_dtype(mx.float16)
    assert kernels.prepare_model(model) == "native"
    assert model.weight.dtype == mx.float16
    assert not kernels.allow_matmul_plan(requested=True, dtype="native")
    report = kernels.report()
    assert {state.why_off for state in report.replacements} == {"not a Linux CPU machine"}


def test_on_linux_with_mlx_s_cuda_backend_every_replacement_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(machine, "_cuda_backend_installed", lambda: True)
    assert not machine.linux_cpu()
    assert why_off("auto") == "not a Linux CPU machine"


def test_the_cpu_only_tests_skip_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(pytest.skip.Exception, match="Linux CPU machine only"):
        require_linux_cpu()


@pytest.mark.usefixtures("linux_cpu_machine")
def test_the_matmul_plan_and_blas_preload_say_why_they_are_off() -> None:
    kernels = CpuKernels("auto", environment={"EXO_NO_BLAS_PRELOAD": "1"})
    assert not kernels.allow_matmul_plan(requested=False, dtype="float32")
    report = kernels.report()
    assert {state.name: state.why_off for state in report.replacements if not state.on} == {
        "int8_weights": "--cpu-weights float32",
        "q8_0_weights": "--cpu-weights float32",
        "gguf_weights": "--cpu-weights float32",
        "matmul_plan": "--no-matmul-plan",
        "blas_preload": "EXO_NO_BLAS_PRELOAD=1",
        "decode_graph": "--cpu-weights float32",
        "layer_graph": "--cpu-weights float32",
        "repacked_blocks": "--cpu-weights float32",
        "rows_kernel": "--cpu-weights float32",
    }
    assert report.describe().startswith("auto: on: float32 weights, numpy attention softmax, numpy SwiGLU; off: ")
