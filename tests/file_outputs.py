"""Test helpers for streaming runs whose output cannot go through a grouping sink.

``assert_that`` and Beam's file sinks group their input, a stateful level of their own;
``WriteEach`` writes each element to its own file instead, so a pipeline keeps the levels
it is written with. ``group_state_operator`` runs a streaming query's levels on PySpark
3.5's ``applyInPandasWithState`` on whichever PySpark the tests run.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest


class WriteEach(beam.DoFn):  # type: ignore[misc]
    """Writes each element (JSON) to a file of its own in ``directory``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def process(self, element: Any) -> None:
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, uuid.uuid4().hex)
        with open(f"{path}.tmp", "w", encoding="utf-8") as file:
            json.dump(element, file)
        os.replace(f"{path}.tmp", path)


def written(directory: Path) -> list[Any]:
    """What ``WriteEach`` wrote to ``directory``, sorted."""
    if not directory.exists():
        return []
    return sorted(
        json.loads(path.read_text(encoding="utf-8"))
        for path in directory.iterdir()
        if not path.name.endswith(".tmp")
    )


def group_state_operator(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Streaming queries from now on run on ``applyInPandasWithState``, as on PySpark 3.5.

    Returns the grouping columns of each such operator built, as they are built.
    """
    from beam_spark_runner.run import streaming as run_streaming
    from beam_spark_runner.spark import stateful_operator
    from beam_spark_runner.streaming import checkpoint, query

    built: list[str] = []
    original = stateful_operator.apply_in_pandas_with_state

    def recording(frame: Any, keys: list[Any], processor: Any, output_type: Any) -> Any:
        built.append(",".join(keys))
        return original(frame, keys, processor, output_type)

    monkeypatch.setattr(stateful_operator, "apply_in_pandas_with_state", recording)
    for module in (stateful_operator, query, checkpoint, run_streaming):
        monkeypatch.setattr(module, "has_state_processor", lambda: False)
    return built
