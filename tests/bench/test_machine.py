"""A report names the commit its run started from, says when the tree held uncommitted changes, and prints no path
of the machine it ran on."""

import subprocess
from pathlib import Path

import pytest

from bench import machine
from bench.__main__ import main
from bench.markdown import without_directories
from tests.bench.test_render import sample_report


def _git(repository: Path, *arguments: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repository), *arguments], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository of one commit, which the bench takes for its own."""
    repository = tmp_path / "repository"
    repository.mkdir()
    _git(repository, "init", "-q")
    (repository / "code.py").write_text("print(1)\n")
    _git(repository, "add", "code.py")
    _git(repository, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    monkeypatch.setattr(machine, "REPOSITORY", repository)
    monkeypatch.delenv(machine.START_COMMIT_VARIABLE, raising=False)
    return repository


def test_the_commit_is_the_one_the_run_started_from(checkout: Path) -> None:
    first = _git(checkout, "rev-parse", "--short", "HEAD")
    assert machine.record_start_commit() == first
    (checkout / "code.py").write_text("print(2)\n")  # the checkout moves on while the run measures
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    assert machine.checkout_commit() != first
    assert machine.exo_commit() == first
    assert machine.section_run(["--only", "parser"]).exo_commit == first


def test_uncommitted_changes_are_flagged_and_untracked_files_are_not(checkout: Path) -> None:
    head = _git(checkout, "rev-parse", "--short", "HEAD")
    (checkout / "results.json").write_text("{}")
    assert machine.checkout_commit() == head
    (checkout / "code.py").write_text("print(3)\n")
    assert machine.checkout_commit() == f"{head} (with uncommitted changes)"
    assert machine.record_start_commit().endswith("(with uncommitted changes)")


def test_absolute_paths_are_cut_to_their_last_part() -> None:
    blas = "mkl from pypi: /work/wt/lead/.venv/lib/libmkl_rt.so.3 (LD_PRELOAD, INTEL threads)"
    assert without_directories(blas) == "mkl from pypi: libmkl_rt.so.3 (LD_PRELOAD, INTEL threads)"
    command = "uv run python -m bench --model /root/.cache/exo/models/qwen --out docs/PERFORMANCE.md"
    assert without_directories(command) == "uv run python -m bench --model qwen --out docs/PERFORMANCE.md"
    assert without_directories("1/2 of tokens, 3.0 tok/s, ~/.cache/exo") == "1/2 of tokens, 3.0 tok/s, ~/.cache/exo"


def test_the_machine_table_holds_no_absolute_path(tmp_path: Path) -> None:
    report = sample_report(load_1=0.2)
    machine_info = report.machine.model_copy(update={"blas": "openblas from the system: /usr/lib/libopenblas.so.0"})
    saved = tmp_path / "results.json"
    saved.write_text(report.model_copy(update={"machine": machine_info}).model_dump_json())
    output = tmp_path / "out" / "PERFORMANCE.md"
    main(["--render", str(saved), "--output", str(output)])
    document = output.read_text()
    assert "| BLAS | openblas from the system: libopenblas.so.0 |" in document
    assert "| Model | test-model |" in document
    assert "/models/test-model" not in document
    assert "| exo commit (as the run started) | abc1234 |" in document
