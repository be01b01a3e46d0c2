"""``fileio.MatchContinuously`` built without a start time starts when its pipeline runs.

Beam's default ``start_timestamp=Timestamp.now()`` is evaluated once, when
``apache_beam.io.fileio`` is first imported, so a ``MatchContinuously`` built later without
a start starts at that import: ``Watch`` then polls past ``stop_timestamp`` for about as
long as the import preceded the build, and ``PeriodicImpulse`` fires every missed interval
at once; in a long-lived process (a notebook, a service, a test suite) that is minutes. The
runner starts such a transform (its ``start_timestamp`` is Beam's default object itself)
when the pipeline runs, or at its stop timestamp if that is earlier. An explicit
``start_timestamp`` is kept; pipelines given as a proto are already expanded and unchanged.
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
