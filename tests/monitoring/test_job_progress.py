"""The progress reporter reads Spark's status tracker; tested with a fake tracker."""

import io
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from beam_spark_runner.monitoring import job_progress
from beam_spark_runner.monitoring.job_progress import ProgressReporter


class FakeTracker:
    def getJobIdsForGroup(self, group):  # noqa: N802 - Spark's API
        return [1, 2] if group == "g" else []

    def getJobInfo(self, job_id):  # noqa: N802
        status = "RUNNING" if job_id == 1 else "SUCCEEDED"
        return SimpleNamespace(status=status, stageIds=[10, 11])

    def getStageInfo(self, stage_id):  # noqa: N802
        return SimpleNamespace(numCompletedTasks=3, numActiveTasks=1, numTasks=4 + stage_id % 2)


def test_summary_counts_tasks_of_running_jobs_of_the_group():
    context = SimpleNamespace(statusTracker=FakeTracker)
    line = ProgressReporter(context, "g", "wordcount").summary()
    assert line is not None
    assert line.startswith("Beam pipeline wordcount: 6/9 Spark tasks done, 2 running")


def test_summary_is_none_without_running_jobs():
    context = SimpleNamespace(statusTracker=FakeTracker)
    assert ProgressReporter(context, "other", "x").summary() is None


@pytest.fixture
def fresh_progress_logger() -> Iterator[logging.Logger]:
    """The progress logger as in a new process; restored afterwards."""
    logger = job_progress.PROGRESS_LOGGER
    saved = (logger.level, list(logger.handlers), logger.propagate)
    root = logging.getLogger()
    root_saved = (root.level, list(root.handlers))
    logger.setLevel(logging.NOTSET)
    logger.handlers.clear()
    logger.propagate = True
    # Python's default level, and a root handler as Beam's import leaves one.
    root.setLevel(logging.WARNING)
    root.handlers = [logging.StreamHandler(io.StringIO())]
    yield logger
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate = saved[2]
    root.setLevel(root_saved[0])
    root.handlers[:] = root_saved[1]


def test_progress_shows_on_stderr_at_the_default_level_once(
    fresh_progress_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    job_progress.progress_logger().info("Beam pipeline p: 1/2 Spark tasks done")
    job_progress.progress_logger().info("again")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].endswith(" Beam pipeline p: 1/2 Spark tasks done")
    root_output = logging.getLogger().handlers[0].stream.getvalue()  # type: ignore[attr-defined]
    assert root_output == ""  # not a second time through Beam's root handler


def test_progress_is_quieted_by_its_loggers_level(
    fresh_progress_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh_progress_logger.setLevel(logging.WARNING)
    job_progress.progress_logger().info("Beam pipeline p: 1/2 Spark tasks done")
    assert capsys.readouterr().err == ""
    # Also after the runner gave it its handler.
    fresh_progress_logger.setLevel(logging.NOTSET)
    job_progress.progress_logger().info("shown")
    fresh_progress_logger.setLevel(logging.WARNING)
    job_progress.progress_logger().info("not shown")
    assert "not shown" not in capsys.readouterr().err


def test_a_configuration_that_shows_info_gets_the_lines_its_own_way(
    fresh_progress_logger: logging.Logger,
) -> None:
    logging.getLogger().setLevel(logging.INFO)
    logger = job_progress.progress_logger()
    assert not logger.handlers and logger.propagate
    logger.info("through the root handler")
    root_output = logging.getLogger().handlers[0].stream.getvalue()  # type: ignore[attr-defined]
    assert "through the root handler" in root_output
