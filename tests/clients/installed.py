"""The real coding-agent CLIs the tests in this folder drive: found at their pinned versions, installed on first
use, or skipped only where npm itself is missing.

`.ci/install-clients` installs each client listed in `.ci/npm-clients` into build/<folder> at the version whose
requests the fixture models were trained on. The first test of a run that needs a client runs that script (once per
run, under a file lock, so parallel pytest processes do not install into the same folder at once); `.ci/run` runs
it too. Where npm exists, a client that npm cannot install is a failure naming it, not a skip: CI must not stay
green by testing nothing.
"""

import fcntl
import os
import shutil
import subprocess
from functools import cached_property
from pathlib import Path
from typing import Final

import pytest

from exo.shared.types.common import FrozenModel
from tests.machine_skips import skip_for_machine

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
MANIFEST: Final = REPO_ROOT / ".ci" / "npm-clients"
INSTALL_SCRIPT: Final = REPO_ROOT / ".ci" / "install-clients"
INSTALL_SECONDS: Final = 1800.0
"""Three clients from an empty npm cache take a few minutes; a stalled registry must still end the run."""


class NpmClient(FrozenModel):
    """One line of `.ci/npm-clients`."""

    folder: str
    binary: str
    package: str
    version: str

    @property
    def install(self) -> Path:
        """Where `.ci/install-clients` puts the binary."""
        return REPO_ROOT / "build" / self.folder / "node_modules" / ".bin" / self.binary


def pinned_clients(manifest: Path = MANIFEST) -> dict[str, NpmClient]:
    """The clients of `manifest`, by folder."""
    clients: dict[str, NpmClient] = {}
    for line in manifest.read_text().splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        folder, binary, package, version = fields
        clients[folder] = NpmClient(folder=folder, binary=binary, package=package, version=version)
    return clients


def version_line(binary: Path) -> str:
    """The first line `binary --version` prints, or "" when it cannot run."""
    try:
        result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = result.stdout.strip().splitlines()
    return lines[0] if result.returncode == 0 and lines else ""


def find_client(client: NpmClient) -> Path | None:
    """The client at its pinned version: the install `.ci/install-clients` makes, else the one on PATH.

    Another version sends other prompts than the fixture model was trained on, so it does not count.
    """
    on_path = shutil.which(client.binary)
    for candidate in (client.install, *([Path(on_path)] if on_path else [])):
        if candidate.is_file() and os.access(candidate, os.X_OK) and client.version in version_line(candidate):
            return candidate
    return None


class InstallOutcome(FrozenModel):
    """What one run of `.ci/install-clients` printed, and how it ended."""

    returncode: int
    output: str


class ClientInstaller:
    """Runs `.ci/install-clients` at most once per test run (per process; the file lock covers the others)."""

    def __init__(self, script: Path = INSTALL_SCRIPT) -> None:
        self.script = script
        self._looked = False

    @cached_property
    def outcome(self) -> InstallOutcome:
        lock_path = self.script.parent.parent / "build" / ".install-clients.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest process may be installing: wait, then find its install
            try:
                result = subprocess.run(
                    [self.script], capture_output=True, text=True, timeout=INSTALL_SECONDS, check=False
                )
            except subprocess.TimeoutExpired as error:
                return InstallOutcome(returncode=-1, output=f"{self.script} ran past {error.timeout:.0f} s")
        return InstallOutcome(returncode=result.returncode, output=result.stdout + result.stderr)

    def ensure_installed(self) -> None:
        """Install every pinned client that is missing (none where npm is missing: those tests skip); looks once
        per run (each look runs every client's `--version`)."""
        if self._looked:
            return
        self._looked = True
        if shutil.which("npm") is not None and any(find_client(client) is None for client in pinned_clients().values()):
            _ = self.outcome


INSTALLER = ClientInstaller()


def require_client(folder: str) -> Path:
    """The pinned client's binary, installed on first use; skips the test only where npm is missing, fails it naming
    the client where npm could not install it."""
    client = pinned_clients()[folder]
    binary = find_client(client)
    if binary is not None:
        return binary
    wanted = f"{client.package}@{client.version}"
    if shutil.which("npm") is None:
        skip_for_machine(f"npm is not installed, so {wanted} cannot be: this real-client test needs it")
    outcome = INSTALLER.outcome
    binary = find_client(client)
    if binary is not None:
        return binary
    pytest.fail(
        f"npm could not install {wanted} into build/{folder} ({INSTALLER.script.name} exited {outcome.returncode}):\n"
        + "\n".join(outcome.output.splitlines()[-30:])
    )
