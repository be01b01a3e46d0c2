"""Windowed values, windows and timestamps: Beam's encodings, read faster from its layouts."""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from typing import Any

from apache_beam import coders
from apache_beam.coders import coder_impl
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.transforms import window
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp


class WindowedHeaders:
    """Reads encoded windowed values' timestamps and windows, not their values.

    Beam's windowed-value encoding (``WindowedValueCoderImpl``) is the timestamp (8 bytes:
    milliseconds, shifted to sort unsigned), the windows (a count, then each window), the
    pane, then the value. ``header`` gives an element's timestamp in microseconds, as
    Beam's decoding gives it, and its windows' bytes: a key for what depends on the
    windows alone, decoded by ``windows`` once per distinct key.

    Neighbouring elements mostly share their windows. The windows' encoding is
    self-delimiting (a count, then windows that are), so an element whose bytes after the
    timestamp start with the previous element's windows' bytes has exactly those windows:
    only a change of windows is decoded.
    """

    _TIME_SHIFT = 1 << 63
    _MIN_MILLIS = -(abs(MIN_TIMESTAMP.micros) // 1000)
    _MAX_MILLIS = MAX_TIMESTAMP.micros // 1000

    def __init__(self, window_coder: Any) -> None:
        self._windows = coder_impl.TupleSequenceCoderImpl(window_coder.get_impl())
        self._last = b""
        self._unpack = struct.Struct(">Q").unpack_from

    @staticmethod
    def of(coder: Any) -> WindowedHeaders | None:
        """Headers of ``coder``'s elements, if it is Beam's windowed-value coder.

        None for any other (a parameterized windowed value carries no header).
        """
        if type(coder) is not coders.coders.WindowedValueCoder:
            return None
        return WindowedHeaders(coder.window_coder)

    def header(self, element: bytes) -> tuple[int, bytes]:
        """One encoded element's timestamp (microseconds) and its windows' bytes."""
        last = self._last
        if not (last and element.startswith(last, 8)):
            last = self._last = self._windows_bytes(element)
        return self._micros(self._unpack(element)[0] - self._TIME_SHIFT), last

    def framed_groups(
        self, run: bytes, frame: struct.Struct, group_of: Callable[[bytes], Any]
    ) -> list[tuple[bytes, int, Any]]:
        """A run of elements, each after its length (``frame``), in pieces of one group.

        ``group_of`` gives the group of an element's windows' bytes (asked again only
        where the windows change); neighbours of one group make a piece: its elements
        concatenated, their earliest timestamp (microseconds, as ``header``) and the group.
        One loop, without a bytes object or a call per element for its header.
        """
        length_of, framing = frame.unpack_from, frame.size
        millis_of, shift = self._unpack, self._TIME_SHIFT
        last = self._last
        pieces: list[tuple[bytes, int, Any]] = []
        elements: list[bytes] = []
        group: Any = None
        changed = True
        earliest = self._MAX_MILLIS
        position, end = 0, len(run)
        while position < end:
            (length,) = length_of(run, position)
            start = position + framing
            position = start + length
            if not (last and run.startswith(last, start + 8, position)):
                last = self._windows_bytes(run[start:position])
                changed = True
            if changed:
                changed = False
                new = group_of(last)
                if elements and new != group:
                    pieces.append((b"".join(elements), self._micros(earliest), group))
                    elements, earliest = [], self._MAX_MILLIS
                group = new
            millis = millis_of(run, start)[0] - shift
            if millis < earliest:
                earliest = millis
            elements.append(run[start:position])
        if elements:
            pieces.append((b"".join(elements), self._micros(earliest), group))
        self._last = last
        return pieces

    def _windows_bytes(self, element: bytes) -> bytes:
        """The bytes of an encoded element's windows."""
        stream = create_InputStream(element)
        stream.read(8)
        self._windows.decode_from_stream(stream, True)
        return element[8 : len(element) - stream.size()]

    def _micros(self, millis: int) -> int:
        """An encoded timestamp's milliseconds as Beam's decoding gives it, in microseconds."""
        if millis <= self._MIN_MILLIS:
            return MIN_TIMESTAMP.micros
        if millis >= self._MAX_MILLIS:
            return MAX_TIMESTAMP.micros
        return millis * 1000

    def windows(self, windows_bytes: bytes) -> tuple[Any, ...]:
        """The windows ``header`` gave the bytes of."""
        return tuple(self._windows.decode_from_stream(create_InputStream(windows_bytes), True))


# An ``IntervalWindow``'s bounds in microseconds, read from the attributes Beam's compiled
# window class keeps them in (``utils/windowed_value.pxd``): ``window.start.micros`` goes
# through a ``Timestamp`` and a Python property, and hashing or comparing windows reads
# ``MIN_TIMESTAMP.micros`` and ``MAX_TIMESTAMP.micros`` each time.
interval_bounds: Callable[[Any], tuple[int, int]] = operator.attrgetter(
    "_start_micros", "_end_micros"
)
_INTERVAL_WINDOW = window.IntervalWindow


# The installed Beam's ``Timestamp`` attributes, and timestamps (µs) the faster makers and
# readers below are checked against Beam's own constructor and property with.
_TIMESTAMP_LAYOUT = vars(Timestamp(micros=0)).keys()
_SECONDS_AT_PRECISION = {"_precision", "_seconds", "_subseconds"}  # Beam 2.7x
_TIMESTAMP_PROBES = (0, 1, -1, 1_700_000_000_123_456, -62_135_596_800_000_000, MIN_TIMESTAMP.micros)


def _timestamp_maker() -> Callable[[int], Any]:
    """A maker of ``Timestamp(micros=m)`` that skips the constructor's checks.

    It sets the attributes of the installed Beam's layout,
    checked against the constructor; the constructor itself for a layout not known here.
    """
    new = Timestamp.__new__
    if _TIMESTAMP_LAYOUT == _SECONDS_AT_PRECISION:
        # Beam 2.7x: seconds and a fraction at a precision (6: microseconds).

        def make(micros: int) -> Any:
            made = new(Timestamp)
            made._precision = 6
            made._seconds, made._subseconds = divmod(micros, 1_000_000)
            return made

    elif _TIMESTAMP_LAYOUT == {"micros"}:
        # Beam 2.69 and before: one attribute.

        def make(micros: int) -> Any:
            made = new(Timestamp)
            made.__dict__["micros"] = micros
            return made

    else:
        return lambda micros: Timestamp(micros=micros)
    if all(vars(make(m)) == vars(Timestamp(micros=m)) for m in _TIMESTAMP_PROBES):
        return make
    return lambda micros: Timestamp(micros=micros)


# ``Timestamp(micros=m)``, faster (a Spark stream's rows make one per timestamp field).
timestamp_of_micros: Callable[[int], Any] = _timestamp_maker()


def _micros_reader() -> Callable[[Any], int]:
    """A reader of ``timestamp.micros`` that skips the property and its method call.

    It reads the attributes of Beam 2.7x's layout,
    checked against the property; the property itself for any other layout (Beam 2.69's
    ``micros`` is an attribute: nothing to skip) and for a timestamp finer than
    microseconds (whose ``micros`` raises, as Beam's does).
    """
    by_property = operator.attrgetter("micros")
    if _TIMESTAMP_LAYOUT != _SECONDS_AT_PRECISION:
        return by_property

    def micros(timestamp: Any) -> int:
        if timestamp._precision == 6:
            return timestamp._seconds * 1_000_000 + timestamp._subseconds  # type: ignore[no-any-return]
        return timestamp.micros  # type: ignore[no-any-return]

    made = [Timestamp(micros=m) for m in _TIMESTAMP_PROBES]
    made += [Timestamp.of(s / 8) for s in range(-9, 9)]
    return micros if all(micros(t) == t.micros for t in made) else by_property


# ``timestamp.micros``, faster (a ``TimestampedValue`` output's windowed value reads it).
micros_of_timestamp: Callable[[Any], int] = _micros_reader()


def window_key(window: Any) -> Any:
    """What tells ``window`` from other windows, cheaply: an ``IntervalWindow``'s bounds.

    An ``IntervalWindow``'s own hash and equality read six ``Timestamp.micros`` properties
    (``MIN_TIMESTAMP``'s and ``MAX_TIMESTAMP``'s); any other window is its own key.
    """
    return interval_bounds(window) if type(window) is _INTERVAL_WINDOW else window


class WindowsAndPane:
    """Windows and a pane in the encodings Beam's windowed-value coder gives them."""

    def __init__(self, window_coder: Any) -> None:
        self._windows = coder_impl.TupleSequenceCoderImpl(window_coder.get_impl())
        self._pane = coder_impl.PaneInfoCoderImpl()

    def encode(self, windows: Any, pane: Any) -> tuple[bytes, bytes]:
        """The bytes of ``windows`` (a count, then each window) and of ``pane``."""
        return self._windows.encode_nested(windows), self._pane.encode_nested(pane)

    def decode(self, windows: bytes, pane: bytes) -> tuple[tuple[Any, ...], Any]:
        """The windows and pane ``encode`` gave the bytes of."""
        return (
            tuple(self._windows.decode_from_stream(create_InputStream(windows), True)),
            self._pane.decode_nested(pane),
        )
