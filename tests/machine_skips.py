"""Skips for a reason of the machine, not of the code: a tool or a right this machine lacks.

Each such skip names its reason through `skip_for_machine` (or `machine_skipif`), so that its message starts with
MACHINE_TAG. Under EXO_STRICT_SKIPS=1, which `.ci/run` sets, tests/conftest.py turns every one of them into a
failure: CI must not pass by skipping what it could not run. The reasons:

- npm missing: the real coding-agent clients cannot be installed (tests/clients);
- chromium missing: the dashboard's browser tests (tests/dashboard);
- network namespaces cannot be made (not root, no `ip`): the cluster rigs (tests/cluster/test_cluster_rig*.py);
- multicast scouting does not work on the loopback interface: discovery (tests/cluster/test_cluster_discovery.py);
- ggml's CPU library is not built (`uv run exo ggml build`): the Q8_0 weights
  (tests/worker/engines/mlx/cpu/test_q8_layers.py);
- cmake, ninja or a C/C++ compiler missing: `exo ggml build` on a stand-in source package
  (tests/worker/engines/mlx/cpu/test_ggml_build.py); CI's `ggml` step installs them.

Skips for another platform (a test of the Linux CPU engine on macOS, the PyPI MKL off x86_64) are not among them:
there the code under test does not apply.
"""

import os
from typing import Final, NoReturn

import pytest

STRICT_VARIABLE: Final = "EXO_STRICT_SKIPS"
MACHINE_TAG: Final = "[machine]"


def strict() -> bool:
    """Whether a skip for a reason of the machine fails the test (EXO_STRICT_SKIPS=1)."""
    return os.environ.get(STRICT_VARIABLE, "").strip() not in ("", "0")


def machine_reason(why: str) -> str:
    return f"{MACHINE_TAG} {why}"


def skip_for_machine(why: str, *, allow_module_level: bool = False) -> NoReturn:
    """Skip because this machine lacks something (a failure under EXO_STRICT_SKIPS=1)."""
    pytest.skip(machine_reason(why), allow_module_level=allow_module_level)


def machine_skipif(why_not: str | None) -> pytest.MarkDecorator:
    """A skipif mark for a reason of the machine (None: nothing is missing)."""
    return pytest.mark.skipif(why_not is not None, reason=machine_reason(why_not or ""))


def is_machine_skip(message: str) -> bool:
    return MACHINE_TAG in message
