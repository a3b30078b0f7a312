"""A pipeline rank's OpenMP threads sleep when idle, unless the user chose their block time."""

from exo.worker.engines.mlx.cpu.rank_threads import BLOCKTIME_VARIABLE, idle_threads_sleep


def test_idle_threads_sleep_at_once() -> None:
    environment = {"PATH": "/usr/bin"}

    idle_threads_sleep(environment)

    assert environment == {"PATH": "/usr/bin", BLOCKTIME_VARIABLE: "0"}


def test_a_block_time_the_user_chose_is_kept() -> None:
    environment = {BLOCKTIME_VARIABLE: "30"}

    idle_threads_sleep(environment)

    assert environment == {BLOCKTIME_VARIABLE: "30"}
