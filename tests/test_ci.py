"""CI's client installs: pinned like the fixtures, failing where npm exists, skipping only where it does not.

`.ci/install-clients` runs here against a fake `npm` on PATH (a script), so no registry is reached.
"""

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.clients import installed
from tests.clients.installed import MANIFEST, REPO_ROOT, pinned_clients
from tests.fixtures.client_requests import CLAUDE_CODE_VERSION, CODEX_VERSION, OPENCODE_VERSION

INSTALL_SCRIPT = REPO_ROOT / ".ci" / "install-clients"


def test_the_installed_clients_are_the_versions_the_fixtures_were_captured_from() -> None:
    versions = {folder: client.version for folder, client in pinned_clients().items()}
    assert versions == {"opencode": OPENCODE_VERSION, "claude-code": CLAUDE_CODE_VERSION, "codex": CODEX_VERSION}


def _fake_npm(bin_dir: Path, behaviour: str) -> None:
    """An `npm` whose `install --prefix P pkg@v` does `behaviour`: fail, or install a binary reporting a version."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    npm = bin_dir / "npm"
    npm.write_text(
        "#!/usr/bin/env bash\n"
        'echo "$*" >> "$(dirname "$0")/calls"\n'
        f"behaviour={behaviour}\n"
        'prefix="$3"; spec="${@: -1}"; version="${spec##*@}"\n'
        'if [[ "$behaviour" == fail ]]; then echo "npm error 404 Not Found: $spec" >&2; exit 1; fi\n'
        '[[ "$behaviour" == wrong ]] && version="0.0.1"\n'
        'mkdir -p "$prefix/node_modules/.bin"\n'
        "for name in opencode claude codex; do\n"
        '  printf "#!/bin/sh\\necho %s\\n" "$version" > "$prefix/node_modules/.bin/$name"\n'
        '  chmod +x "$prefix/node_modules/.bin/$name"\n'
        "done\n"
    )
    npm.chmod(0o755)


def _run_install(tmp_path: Path, path: str, manifest: Path = MANIFEST) -> subprocess.CompletedProcess[str]:
    """The script from a copy of the repository's .ci folder (its build/ lands in tmp_path)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / ".ci", checkout / ".ci")
    environment = {**os.environ, "PATH": path, "EXO_NPM_CLIENTS": str(manifest)}
    script = checkout / ".ci" / "install-clients"
    return subprocess.run([script], env=environment, capture_output=True, text=True, timeout=120, check=False)


def _system_path_without_npm(tmp_path: Path) -> str:
    """Folders holding bash and the coreutils the script uses, linked one by one so that no npm comes along."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for tool in ("bash", "env", "mktemp", "rm", "tail", "head", "sleep", "timeout", "dirname", "mkdir", "chmod"):
        found = shutil.which(tool)
        assert found is not None, tool
        if not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    return str(tools)


def test_a_package_that_fails_to_install_fails_the_script_naming_it_after_one_retry(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    _fake_npm(fake, "fail")
    manifest = tmp_path / "clients"
    manifest.write_text("# a broken package name\nopencode opencode opencode-ai-no-such-package 1.18.33\n")
    result = _run_install(tmp_path, f"{fake}:{_system_path_without_npm(tmp_path)}", manifest)
    assert result.returncode != 0
    assert "FAILED opencode-ai-no-such-package@1.18.33: npm install failed twice" in result.stderr
    assert len((fake / "calls").read_text().splitlines()) == 2  # the first try and one retry


def test_a_client_reporting_another_version_fails_the_script_naming_it(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    _fake_npm(fake, "wrong")
    result = _run_install(tmp_path, f"{fake}:{_system_path_without_npm(tmp_path)}")
    assert result.returncode != 0
    for client in pinned_clients().values():
        assert f"FAILED {client.package}@{client.version}: " in result.stderr
        assert "reports '0.0.1'" in result.stderr


def test_clients_that_install_at_their_pinned_version_pass(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    _fake_npm(fake, "right")
    result = _run_install(tmp_path, f"{fake}:{_system_path_without_npm(tmp_path)}")
    assert result.returncode == 0, result.stderr
    for client in pinned_clients().values():
        assert (tmp_path / "checkout" / "build" / client.folder / "node_modules" / ".bin" / client.binary).is_file()


def test_without_npm_nothing_is_installed_and_the_script_passes_saying_why(tmp_path: Path) -> None:
    result = _run_install(tmp_path, _system_path_without_npm(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "npm not found" in result.stdout
    assert not (tmp_path / "checkout" / "build").exists()


def test_a_client_test_skips_only_where_npm_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(installed, "find_client", lambda _client: None)
    monkeypatch.setattr(installed, "INSTALLER", _installer_in_a_copy(tmp_path))
    monkeypatch.setenv("PATH", _system_path_without_npm(tmp_path))
    with pytest.raises(pytest.skip.Exception, match="npm is not installed"):
        installed.require_client("opencode")
    assert not (tmp_path / "checkout" / "build").exists()  # nothing was tried


def _installer_in_a_copy(tmp_path: Path) -> installed.ClientInstaller:
    """An installer running the script from a copy of .ci (so its build/ lands in tmp_path)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / ".ci", checkout / ".ci")
    return installed.ClientInstaller(checkout / ".ci" / "install-clients")


def _found_in_copy(tmp_path: Path) -> Callable[[installed.NpmClient], Path | None]:
    """`find_client` looking in the copy's build/ instead of the repository's."""

    def find(client: installed.NpmClient) -> Path | None:
        binary = tmp_path / "checkout" / "build" / client.folder / "node_modules" / ".bin" / client.binary
        return binary if binary.is_file() and client.version in installed.version_line(binary) else None

    return find


def test_a_missing_client_is_installed_by_the_first_test_that_needs_it_once_per_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "fake"
    _fake_npm(fake, "right")
    monkeypatch.setenv("PATH", f"{fake}:{_system_path_without_npm(tmp_path)}")
    monkeypatch.setattr(installed, "find_client", _found_in_copy(tmp_path))
    monkeypatch.setattr(installed, "INSTALLER", _installer_in_a_copy(tmp_path))
    opencode = installed.require_client("opencode")
    assert opencode == tmp_path / "checkout" / "build" / "opencode" / "node_modules" / ".bin" / "opencode"
    assert installed.require_client("codex").is_file()
    assert installed.require_client("claude-code").is_file()
    calls = (fake / "calls").read_text().splitlines()
    assert len(calls) == len(installed.pinned_clients())  # one npm install per client, in one run of the script


def test_before_the_first_client_test_every_missing_client_is_installed_and_only_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "fake"
    _fake_npm(fake, "right")
    monkeypatch.setenv("PATH", f"{fake}:{_system_path_without_npm(tmp_path)}")
    looks: list[str] = []
    found = _found_in_copy(tmp_path)

    def counting_find(client: installed.NpmClient) -> Path | None:
        looks.append(client.folder)
        return found(client)

    monkeypatch.setattr(installed, "find_client", counting_find)
    installer = _installer_in_a_copy(tmp_path)
    installer.ensure_installed()  # what tests/clients/conftest.py does before each npm_clients test
    installer.ensure_installed()
    assert len((fake / "calls").read_text().splitlines()) == len(installed.pinned_clients())
    assert looks == ["opencode"]  # the first missing client was enough to install them all; no second look
    assert all(found(client) is not None for client in installed.pinned_clients().values())


def test_a_client_npm_cannot_install_fails_the_test_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    _fake_npm(fake, "fail")
    monkeypatch.setenv("PATH", f"{fake}:{_system_path_without_npm(tmp_path)}")
    monkeypatch.setattr(installed, "find_client", _found_in_copy(tmp_path))
    monkeypatch.setattr(installed, "INSTALLER", _installer_in_a_copy(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r"npm could not install opencode-ai@1\.18\.33") as failure:
        installed.require_client("opencode")
    assert "npm error 404 Not Found: opencode-ai@1.18.33" in str(failure.value)


def _run_ci(tmp_path: Path, failing: str = "", pytest_status: int = 0) -> tuple[int, list[str]]:
    """`.ci/run` from a copy of .ci, with a fake `uv` that records its commands: the one starting with `failing`
    exits 1, `uv run pytest` exits `pytest_status`. No npm on PATH, so no client is installed."""
    fake = tmp_path / "fake"
    fake.mkdir()
    calls = tmp_path / "uv-calls"
    uv = fake / "uv"
    uv.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        f'[[ "$*" == "run pytest"* ]] && echo "EXO_STRICT_SKIPS=${{EXO_STRICT_SKIPS:-}}" >> {calls}.environment\n'
        f'[[ "$*" == "run pytest"* ]] && echo "EXO_GGML_DIR=${{EXO_GGML_DIR:-}}" >> {calls}.environment\n'
        f'[[ "$*" == "run exo ggml build"* && "{failing}" != "run exo ggml build"* ]] && echo /cache/ggml/lib\n'
        f'[[ -n "{failing}" && "$*" == "{failing}"* ]] && exit 1\n'
        f'[[ "$*" == "run pytest"* ]] && exit {pytest_status}\n'
        "exit 0\n"
    )
    uv.chmod(0o755)
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / ".ci", checkout / ".ci")
    environment = {**os.environ, "PATH": f"{fake}:{_system_path_without_npm(tmp_path)}"}
    environment.pop("EXO_STRICT_SKIPS", None)
    result = subprocess.run(
        [checkout / ".ci" / "run"], env=environment, capture_output=True, text=True, timeout=120, check=False
    )
    return result.returncode, calls.read_text().splitlines() if calls.exists() else []


def test_ci_runs_ruff_basedpyright_builds_ggml_then_the_readme_test_command_last(tmp_path: Path) -> None:
    status, calls = _run_ci(tmp_path)
    assert status == 0
    assert calls == [
        "run ruff check",
        "run ruff format --check",
        "run basedpyright",
        "run exo ggml build --root build/ggml",
        "run pytest",
    ]
    # In strict mode: a test skipped for a reason of the machine (no npm, no chromium, no root) fails CI. The
    # folder the ggml build printed reaches the tests (the quantized CPU path's).
    assert (tmp_path / "uv-calls.environment").read_text() == "EXO_STRICT_SKIPS=1\nEXO_GGML_DIR=/cache/ggml/lib\n"


@pytest.mark.parametrize(
    "failing", ["run ruff check", "run ruff format --check", "run basedpyright", "run exo ggml build"]
)
def test_a_failing_check_fails_ci_before_the_tests(tmp_path: Path, failing: str) -> None:
    status, calls = _run_ci(tmp_path, failing=failing)
    assert status != 0
    assert calls[-1].startswith(failing)  # the failing command was the last one run
    assert "run pytest" not in calls


@pytest.mark.parametrize("pytest_status", [1, 2, 5])
def test_every_pytest_exit_code_but_zero_fails_ci(tmp_path: Path, pytest_status: int) -> None:
    status, calls = _run_ci(tmp_path, pytest_status=pytest_status)
    assert status == pytest_status
    assert calls[-1] == "run pytest"
