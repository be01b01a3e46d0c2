"""The progress reporter reads Spark's status tracker; tested with a fake tracker."""

from types import SimpleNamespace

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
