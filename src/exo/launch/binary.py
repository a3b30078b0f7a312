"""Find a client's executable: the one named on the command line, else on PATH, else a pinned test install."""

import os
import shutil
from pathlib import Path
from typing import Final

from exo.launch.plan import ClientInfo, LaunchError

# Where .ci/install-clients puts the pinned clients (build/<folder>/node_modules/.bin) when exo runs from its
# source checkout. Only that checkout's folder is searched, never the current one: a project folder's build/
# could hold anything.
CLIENTS_DIR_VARIABLE: Final = "EXO_CLIENTS_DIR"
_CHECKOUT: Final = Path(__file__).resolve().parents[3]


def default_clients_dir() -> Path | None:
    """The checkout's build/ folder, when exo runs from a source checkout that has one."""
    build = _CHECKOUT / "build"
    return build if (_CHECKOUT / "pyproject.toml").is_file() and build.is_dir() else None


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_client(client: ClientInfo, explicit: Path | None, environment: dict[str, str]) -> Path:
    """The client's executable. LaunchError with the install command when there is none."""
    if explicit is not None:
        if not _runnable(explicit):
            raise LaunchError(f"--client-bin {explicit} is not an executable file")
        return explicit.resolve()
    on_path = shutil.which(client.binary, path=environment.get("PATH", os.defpath))
    if on_path is not None:
        return Path(on_path)
    configured = environment.get(CLIENTS_DIR_VARIABLE)
    clients_dir = Path(configured) if configured else default_clients_dir()
    if clients_dir is not None:
        pinned = clients_dir / client.folder / "node_modules" / ".bin" / client.binary
        if _runnable(pinned):
            return pinned
    raise LaunchError(
        f"{client.display_name} is not installed: no `{client.binary}` on PATH. Install it with "
        f"`{client.install_command()}` (the version exo is tested with), or name its executable with --client-bin"
    )
