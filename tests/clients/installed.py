"""The real coding-agent CLIs the tests in this folder drive: found at their pinned versions, or skipped only
where npm itself is missing.

`.ci/install-clients` installs each client listed in `.ci/npm-clients` into build/<folder> at the version whose
requests the fixture models were trained on. Where npm exists, a client that is missing or at another version is a
failure, not a skip: CI must not stay green by testing nothing.
"""

import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest

from exo.shared.types.common import FrozenModel

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
MANIFEST: Final = REPO_ROOT / ".ci" / "npm-clients"


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


def require_client(folder: str) -> Path:
    """The pinned client's binary; skips the test only where npm is missing, fails it where npm could install it."""
    client = pinned_clients()[folder]
    binary = find_client(client)
    if binary is not None:
        return binary
    wanted = f"{client.package}@{client.version}"
    if shutil.which("npm") is None:
        pytest.skip(f"npm is not installed, so {wanted} cannot be: this real-client test needs it")
    pytest.fail(f"{wanted} is not installed in build/{folder} although npm is: run .ci/install-clients")
