"""Opening a run: the session it asks for (no Spark started)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from beam_spark_runner.run import lifecycle
from beam_spark_runner.run.lifecycle import OpenRun


class _Asked(Exception):
    """Raised by the stand-in for ``obtain_session`` once it has recorded its call."""


@pytest.mark.parametrize("streaming", [False, True])
def test_a_run_asks_for_a_session_for_streaming_or_batch(
    monkeypatch: pytest.MonkeyPatch, streaming: bool
) -> None:
    asked: list[tuple[Any, bool]] = []

    def obtain_session(settings: Any, streaming: bool = False) -> Any:
        asked.append((settings, streaming))
        raise _Asked

    monkeypatch.setattr(lifecycle, "obtain_session", obtain_session)
    prepared = types.SimpleNamespace(settings="the settings", streaming=streaming)
    with pytest.raises(_Asked):
        OpenRun.open(prepared)  # type: ignore[arg-type]
    assert asked == [("the settings", streaming)]
