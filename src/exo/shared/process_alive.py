"""Whether a process still runs: what decides that a folder it left behind can go."""

import os


def process_alive(pid: int) -> bool:
    """The process `pid` exists (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is just not ours
    return True
