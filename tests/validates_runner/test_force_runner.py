"""validates_runner.force_runner: which runs of a test's pipelines it counts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from beam_spark_runner.errors import UnsupportedFeatureError
from validates_runner import force_runner


class TriggerTest:
    """Stands for a Beam test class."""


class _Item:
    module = SimpleNamespace(__name__="apache_beam.transforms.trigger_test")
    cls = TriggerTest
    name = "test_panes"

    def __init__(self) -> None:
        self.user_properties: list[tuple[str, str]] = []


def _through(hook: Any, item: _Item) -> None:
    wrapper = hook(item)
    next(wrapper)
    with pytest.raises(StopIteration):
        next(wrapper)


@pytest.mark.parametrize(
    ("outcome", "ran", "refused"),
    [("runs", 1, 0), ("fails on Spark", 1, 0), ("is refused", 0, 1)],
)
def test_each_pipeline_run_on_the_runner_is_counted_as_ran_or_refused(
    monkeypatch: pytest.MonkeyPatch, outcome: str, ran: int, refused: int
) -> None:
    def run_pipeline(self: Any, pipeline: Any, options: Any) -> str:
        if outcome == "fails on Spark":
            raise RuntimeError("user code failed")
        if outcome == "is refused":
            raise UnsupportedFeatureError("refused before Spark")
        return "result"

    monkeypatch.setattr(force_runner, "_run_pipeline", run_pipeline)
    item = _Item()
    _through(force_runner.pytest_runtest_setup, item)
    try:
        force_runner.counted_run_pipeline(None, None, None)  # type: ignore[arg-type]
    except (RuntimeError, UnsupportedFeatureError):
        pass
    _through(force_runner.pytest_runtest_teardown, item)
    assert item.user_properties == [
        (
            force_runner.TEST_ID_PROPERTY,
            "apache_beam.transforms.trigger_test.TriggerTest::test_panes",
        ),
        (force_runner.RAN_PROPERTY, str(ran)),
        (force_runner.REFUSED_PROPERTY, str(refused)),
    ]


def test_a_test_counts_only_its_own_pipelines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(force_runner, "_run_pipeline", lambda self, pipeline, options: None)
    force_runner.counted_run_pipeline(None, None, None)  # type: ignore[arg-type]
    item = _Item()
    _through(force_runner.pytest_runtest_setup, item)
    _through(force_runner.pytest_runtest_teardown, item)
    assert (force_runner.RAN_PROPERTY, "0") in item.user_properties
