"""The bench's exo servers load the ggml build the caller's own node would (their fresh `EXO_HOME` holds none)."""

from pathlib import Path

import pytest

from bench import servers
from exo.worker.engines.mlx.cpu.ggml_locate import GGML_DIR_VARIABLE


def test_a_bench_server_is_given_the_callers_ggml_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(GGML_DIR_VARIABLE, raising=False)
    monkeypatch.setattr(servers, "find_ggml_library", lambda: tmp_path / "lib")
    assert servers._ggml_of_the_caller() == {GGML_DIR_VARIABLE: str(tmp_path / "lib")}  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setattr(servers, "find_ggml_library", lambda: None)
    assert servers._ggml_of_the_caller() == {}  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setenv(GGML_DIR_VARIABLE, "/a/build/of/the/callers")  # named by the caller: passed on as it is
    monkeypatch.setattr(servers, "find_ggml_library", lambda: tmp_path / "lib")
    assert servers._ggml_of_the_caller() == {}  # pyright: ignore[reportPrivateUsage]
