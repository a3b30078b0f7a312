"""The `exo` console script imports nothing at its top, so the runners it spawns do not import the API server:
spawning runs the parent's script again in each child (as `__mp_main__`)."""

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_MODULES = ("exo.main", "uvicorn", "zenoh", "cryptography")

_SCRIPT = """
import multiprocessing
import sys

{entry_import}


def report(queue):
    queue.put(sorted(name for name in {modules!r} if name in sys.modules))


if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=report, args=(queue,))
    child.start()
    print(queue.get(timeout=60))
    child.join()
"""


def _spawned_child_modules(entry_import: str, folder: Path) -> str:
    """What a process spawned from a script that imports `entry_import`, as the console script does, holds of
    SERVER_MODULES."""
    script = folder / "exo-script.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(entry_import=entry_import, modules=SERVER_MODULES)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


def test_the_console_script_is_the_import_free_entry_point() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["exo"] == "exo.console:main"


def test_a_process_spawned_by_the_console_script_does_not_import_the_server(tmp_path: Path) -> None:
    assert _spawned_child_modules("from exo.console import main", tmp_path) == "[]"
    # The entry point it replaced: every spawned runner imported the server's modules.
    assert _spawned_child_modules("from exo.main import main", tmp_path) == repr(sorted(SERVER_MODULES))
