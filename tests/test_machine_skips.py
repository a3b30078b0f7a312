"""Under EXO_STRICT_SKIPS=1 a skip for a reason of the machine fails; other skips, and every skip without it, stay
skips. Run on a small test file of its own through pytester, with the project's report hook."""

import pytest

from tests.machine_skips import STRICT_VARIABLE

TESTS = """
import pytest

from tests.machine_skips import machine_skipif, skip_for_machine

def test_without_a_tool():
    skip_for_machine("npm is not installed")

@machine_skipif("cannot create a network namespace")
def test_without_root():
    pass

@machine_skipif(None)
def test_with_everything():
    pass

@pytest.mark.skipif(True, reason="Linux only")
def test_on_another_platform():
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_skips=TESTS)
    return pytester


def test_machine_skips_are_skips_by_default(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STRICT_VARIABLE, raising=False)
    project.runpytest().assert_outcomes(passed=1, skipped=3)


def test_strict_mode_fails_machine_skips_and_keeps_platform_skips(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STRICT_VARIABLE, "1")
    result = project.runpytest("-ra")
    # A skip mark acts while the test is set up: its failure is reported as an error, which fails the run as well.
    result.assert_outcomes(passed=1, skipped=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR*test_without_root*", "*FAILED*test_without_a_tool*"])
    assert "a skip for a reason of the machine fails: Skipped: [machine] npm is not installed" in result.stdout.str()
