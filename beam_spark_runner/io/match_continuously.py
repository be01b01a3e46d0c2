"""``fileio.MatchContinuously`` built without a start time starts when its pipeline runs.

Beam declares ``MatchContinuously(..., start_timestamp=Timestamp.now(), ...)``: Python
evaluates that default once, when ``apache_beam.io.fileio`` is first imported, so every
``MatchContinuously`` built later without a ``start_timestamp`` starts at that import, not
"now". Beam's deduplicating expansion (``Watch``) stops after ``ceil((stop - start) /
interval)`` polls, one per interval, so such a transform polls for about as long past its
``stop_timestamp`` as the process had imported ``fileio`` before it was built; without
deduplication, ``PeriodicImpulse`` fires every missed interval at once. In a long-lived
process (a notebook, a service, a test suite; ``apache_beam.dataframe`` imports ``fileio``)
that is minutes. Seen: ``tests/test_streaming.py``'s ``MatchContinuously(interval=2,
stop_timestamp=now + 45)`` run 192 s after ``fileio`` was imported polled 119 times and
ended 300 s after it started, 255 s past its stop timestamp; 12 minutes into the test
suite it ran past the test's 300 s wait.

The runner gives such a transform (its ``start_timestamp`` is Beam's default object itself)
the time the pipeline is run as its start, or its stop timestamp if that is earlier. An
explicit ``start_timestamp`` is kept. Pipelines given to the runner as a proto are not
changed (their transforms are already expanded).
"""

from __future__ import annotations

import copy
import inspect
import logging
import sys
from typing import Any

from apache_beam.pipeline import AppliedPTransform, PTransformOverride
from apache_beam.utils.timestamp import Timestamp

_LOGGER = logging.getLogger(__name__)

_FILEIO = "apache_beam.io.fileio"


def _beam_default_start(match_continuously: type) -> Any:
    """The object Beam's ``MatchContinuously`` gets when no ``start_timestamp`` is given."""
    init = vars(match_continuously)["__init__"]
    return inspect.signature(init).parameters["start_timestamp"].default


class MatchContinuouslyStartOverride(PTransformOverride):  # type: ignore[misc]
    """Replaces a ``MatchContinuously`` left at Beam's import-time start by one starting now."""

    def __init__(self, match_continuously: type, now: Timestamp) -> None:
        self._type: Any = match_continuously
        self._default = _beam_default_start(match_continuously)
        self._now = now

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        transform: Any = applied_ptransform.transform
        return isinstance(transform, self._type) and transform.start_ts is self._default

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> Any:
        transform: Any = applied_ptransform.transform
        start = min(self._now, Timestamp.of(transform.stop_ts))
        _LOGGER.info(
            "%s '%s' has no start_timestamp; Beam's default is the time %s was imported "
            "(%s, %.0f s before this run): it starts at %s, when the pipeline runs",
            type(transform).__name__,
            applied_ptransform.full_label,
            _FILEIO,
            Timestamp.of(self._default).to_rfc3339(),
            (self._now - Timestamp.of(self._default)).micros / 1e6,
            start.to_rfc3339(),
        )
        replacement = copy.copy(transform)
        replacement.start_ts = start
        return replacement


def start_match_continuously_now(pipeline: Any, now: Timestamp | None = None) -> None:
    """Gives each ``MatchContinuously`` of ``pipeline`` without a start time ``now``.

    Nothing to do unless Beam's ``fileio`` is imported (a pipeline using the transform
    imported it); the runner does not import it itself.
    """
    fileio = sys.modules.get(_FILEIO)
    if fileio is None:
        return
    pipeline.replace_all(
        [MatchContinuouslyStartOverride(fileio.MatchContinuously, now or Timestamp.now())]
    )
