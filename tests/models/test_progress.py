"""Progress of long model work: snapshots with rate and time left, throttled; bars on a terminal, lines otherwise."""

import io
import logging

import pytest

from exo.models.progress import MIN_PUBLISH_INTERVAL_SECONDS, ByteCounter, PreparationTracker
from exo.models.progress_display import LINE_INTERVAL_SECONDS, ConsoleProgress, describe_preparation
from exo.shared.types.common import ModelId
from exo.shared.types.preparation import ModelPreparation, ProgressUpdate

MODEL = ModelId("some-model")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tracker(clock: FakeClock) -> tuple[PreparationTracker, list[ModelPreparation]]:
    published: list[ModelPreparation] = []
    return PreparationTracker(MODEL, (published.append,), clock=clock, wall_clock=clock), published


def test_snapshots_carry_rate_and_time_left_for_the_current_phase() -> None:
    clock = FakeClock()
    tracker, published = _tracker(clock)

    tracker(ProgressUpdate(phase="downloading", done_bytes=0, total_bytes=1000))
    clock.now += 2
    tracker(ProgressUpdate(phase="downloading", done_bytes=400, total_bytes=1000))

    assert published[-1].bytes_per_second == pytest.approx(200)
    assert published[-1].seconds_left == pytest.approx(3)
    clock.now += 10
    tracker(ProgressUpdate(phase="converting", done_bytes=0, total_bytes=50))
    assert (published[-1].phase, published[-1].bytes_per_second, published[-1].seconds_left) == (
        "converting",
        None,
        None,
    )
    clock.now += 1
    tracker(ProgressUpdate(phase="converting", done_bytes=50, total_bytes=50))
    assert published[-1].bytes_per_second == pytest.approx(50)  # the new phase's own rate, not the download's
    assert published[-1].started_at == 1000.0


def test_updates_are_throttled_but_phase_changes_and_completion_always_publish() -> None:
    clock = FakeClock()
    tracker, published = _tracker(clock)

    tracker(ProgressUpdate(phase="assembling", done_bytes=0, total_bytes=100))
    for done in range(1, 100):
        tracker(ProgressUpdate(phase="assembling", done_bytes=done, total_bytes=100))
    clock.now += MIN_PUBLISH_INTERVAL_SECONDS
    tracker(ProgressUpdate(phase="assembling", done_bytes=99, total_bytes=100))
    tracker(ProgressUpdate(phase="assembling", done_bytes=100, total_bytes=100))

    assert [snapshot.done_bytes for snapshot in published] == [0, 99, 100]


def test_finish_and_fail_keep_how_far_the_work_got() -> None:
    clock = FakeClock()
    tracker, published = _tracker(clock)
    counter = ByteCounter("downloading", 500, tracker)
    counter.add(200)

    tracker.fail("network down")

    assert (published[-1].phase, published[-1].done_bytes, published[-1].error) == ("failed", 200, "network down")
    tracker.finish()
    assert (published[-1].phase, published[-1].done_bytes, published[-1].total_bytes) == ("ready", 500, 500)


def _snapshot(phase: str, done: int, total: int = 1_000_000_000, **extra: object) -> ModelPreparation:
    return ModelPreparation.model_validate(
        {
            "model_id": MODEL,
            "phase": phase,
            "done_bytes": done,
            "total_bytes": total,
            "started_at": 0.0,
            "updated_at": 0.0,
            **extra,
        }
    )


def test_a_line_says_bytes_percent_rate_and_time_left() -> None:
    line = describe_preparation(_snapshot("downloading", 230_100_000, bytes_per_second=35_200_000.0, seconds_left=25.4))

    assert line == "downloading some-model: 230.1 MB of 1.0 GB (23%), 35.2 MB/s, 25 s left"
    assert describe_preparation(_snapshot("failed", 0, error="boom")) == "failed some-model: boom"


def test_without_a_terminal_progress_is_a_few_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    console = ConsoleProgress(io.StringIO(), terminal=False, clock=clock)
    caplog.set_level(logging.INFO, logger="exo.progress")

    console(_snapshot("downloading", 0))
    for step in range(1, 40):  # 39 updates over 19.5 s: one more line after 10 s
        clock.now += 0.5
        console(_snapshot("downloading", step * 10_000_000))
    console(_snapshot("downloading", 1_000_000_000))
    console(_snapshot("downloading", 1_000_000_000))  # a repeated final update is not logged twice
    console(_snapshot("converting", 0))

    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 4
    assert lines[0].startswith("downloading some-model: 0 bytes of 1.0 GB (0%)")
    assert lines[1].startswith(f"downloading some-model: {LINE_INTERVAL_SECONDS / 0.5 * 10:.1f} MB of 1.0 GB")
    assert lines[2].startswith("downloading some-model: 1.0 GB of 1.0 GB (100%)")
    assert lines[3].startswith("converting some-model")


def test_on_a_terminal_progress_is_a_bar_with_bytes_rate_and_time_left() -> None:
    screen = io.StringIO()
    console = ConsoleProgress(screen, terminal=True)

    console(_snapshot("downloading", 0))
    console(_snapshot("downloading", 500_000_000))
    console(_snapshot("ready", 1_000_000_000))
    console.close()

    drawn = screen.getvalue()
    assert "downloading some-model" in drawn
    assert "0.5/1.0 GB" in drawn
