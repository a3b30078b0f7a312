"""Where exo keeps its state and models: light enough for commands that only look (`exo models`)."""

import os
from pathlib import Path


def exo_home() -> Path:
    """exo's state directory: `$EXO_HOME`, else `~/.cache/exo`."""
    configured = os.environ.get("EXO_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "exo"


def default_models_dir() -> Path:
    """Where downloaded and converted models live: `exo_home()/models`."""
    return exo_home() / "models"
