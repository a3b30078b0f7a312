"""`exo`'s throughput flags reach the node's configuration, and a batch size below one is refused by argparse."""

import pytest

from exo.main import build_parser, config_from_args


def test_batching_and_speculation_are_on_by_default() -> None:
    config = config_from_args(build_parser().parse_args([]))
    assert config.batch_size == 8
    assert config.speculation


def test_the_flags_set_the_batch_size_and_turn_speculation_off() -> None:
    config = config_from_args(build_parser().parse_args(["--batch-size", "1", "--no-speculation"]))
    assert config.batch_size == 1
    assert not config.speculation


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_batch_size_below_one_or_not_a_number_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--batch-size", value])
    assert exited.value.code == 2
    assert "--batch-size" in capsys.readouterr().err
