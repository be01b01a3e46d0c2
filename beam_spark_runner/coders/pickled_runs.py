"""Windowed values in pickled runs: one pickle per run of elements, not one per element.

Between the runner's own steps (a router's stage and the stage with side inputs reading its
output), the elements of a PCollection whose value coder pickles them (Beam's
``FastPrimitivesCoder`` falling back to ``PickleCoder``: a PCollection without a type hint)
may go as runs. A run holds elements of the same windows and pane: a header (``_MAGIC``,
the windows' and the pane's bytes as Beam's windowed-value coder encodes them, then each
element's timestamp as that coder encodes it) and the values, pickled together.
``RunReader`` gives back what Beam's coder would decode for each element (timestamps in
milliseconds, its windows, its pane, an equal value); only values that were one object in a
run may come back as one object (Beam forbids mutating an element). A run's first byte
(0xFF) starts no element Beam's windowed-value coder encodes: its timestamp (milliseconds,
shifted by 2**63, big-endian) starts with 0x7F or 0x80.
"""

from __future__ import annotations

import itertools
import pickle
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from apache_beam.coders import coders
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP

from beam_spark_runner import beam_internals as bi

_MAGIC = b"\xff\x01"
# The values of a run, at most (a group's are cut in runs once each part has as many):
# pickle's memo of a longer run costs more per value.
RUN_VALUES = 1000
# After the magic: the windows' bytes' length, the pane's bytes' length, the element count.
_HEADER = struct.Struct(">IBI")
_PRIMITIVES = frozenset({type(None), int, float, bytes, str, bool})
_CONTAINERS = frozenset({list, tuple, dict, set})
_TIME_SHIFT = np.int64(-(1 << 63))  # the sign bit: Beam's timestamp shift, as an XOR
_MIN_MICROS = MIN_TIMESTAMP.micros
_MAX_MICROS = MAX_TIMESTAMP.micros
_MIN_MILLIS = -(abs(_MIN_MICROS) // 1000)
_MAX_MILLIS = _MAX_MICROS // 1000


def is_run(data: bytes) -> bool:
    """Whether ``data`` starts with a run (else with an element Beam's coder encoded)."""
    return data[:1] == _MAGIC[:1]


def pickles_in_runs(coder: Any) -> bool:
    """Whether elements of ``coder`` (a windowed-value coder) may go in runs."""
    return type(coder) is coders.WindowedValueCoder and bi.pickles_values(coder.wrapped_value_coder)


class RunWriter:
    """Makes one output's runs as its windowed values come, a batch's chunks in turn.

    Values of one group (windows and pane) wait until they are ``RUN_VALUES`` per part,
    then go as ``parts`` runs of equal sizes (the readers' shards, a run each in turn), so
    few are alive at once; ``finish`` cuts what is left. A value that may not go in a run
    (it holds one of Beam's iterable-like types, which its coder decodes as a list) stops
    the runs: ``add`` says so, and ``give_up`` returns every value it took.
    """

    def __init__(self, coder: Any, parts: int) -> None:
        self._coder = coder
        self._windows = bi.WindowsAndPane(coder.window_coder)
        self._parts = parts
        self.made: list[bytes] = []
        # (windows, pane) -> (windows' and pane's bytes, values, their timestamps in µs)
        self._groups: dict[Any, tuple[tuple[bytes, bytes], list[Any], list[int]]] = {}

    def add(self, values: list[Any]) -> bool:
        """Takes windowed values; False (taking none) if one may not go in a run."""
        if not _all_plain([value.value for value in values]):
            return False
        groups = self._groups
        last_windows: Any = None
        last_pane: Any = None
        group: Any = None
        full = RUN_VALUES * self._parts
        for value in values:
            windows, pane = value.windows, value.pane_info
            # Neighbours mostly hold the same window objects (in a new list each).
            if not (pane is last_pane and (windows is last_windows or windows == last_windows)):
                last_windows, last_pane = windows, pane
                key = (tuple(windows), pane)
                group = groups.get(key)
                if group is None:
                    group = groups[key] = (self._windows.encode(*key), [], [])
            group[1].append(value.value)
            group[2].append(value.timestamp_micros)
            if len(group[1]) >= full:
                self._cut(group)
        return True

    def finish(self) -> list[bytes]:
        """The runs: those made, then the rest of each group's values."""
        for group in self._groups.values():
            self._cut(group)
        self._groups = {}
        return self.made

    def give_up(self) -> list[Any]:
        """Every windowed value taken (those in runs first), no run kept."""
        reader = RunReader(self._coder)
        taken = [value for run in self.made for value in reader.values(run)]
        make = bi.create_windowed_value
        for (windows, pane), (_, values, micros) in self._groups.items():
            taken.extend(map(make, values, micros, [windows] * len(values), [pane] * len(values)))
        self.made, self._groups = [], {}
        return taken

    def _cut(self, group: tuple[tuple[bytes, bytes], list[Any], list[int]]) -> None:
        """A group's values in ``parts`` runs of equal sizes (fewer if fewer values)."""
        head, values, micros = group
        each, more = divmod(len(values), self._parts)
        start = 0
        for part in range(self._parts):
            end = start + each + (part < more)
            if end > start:
                self.made.append(_run(head, values[start:end], micros[start:end]))
            start = end
        values.clear()
        micros.clear()


# Types a run may hold as they are (``_plain``), learnt as they come.
_plain_types: set[type] = set(_PRIMITIVES)


def _all_plain(values: list[Any]) -> bool:
    types = set(map(type, values))
    if types <= _plain_types:
        return True
    for kind in types - _plain_types:
        if kind not in _CONTAINERS and not hasattr(kind, "__iter__"):
            _plain_types.add(kind)
    if types <= _plain_types:
        return True
    return all(_plain(value) for value in values)


def _plain(value: Any) -> bool:
    """Whether ``value`` pickles to what its coder decodes.

    It does if, through the containers the coder encodes itself, it reaches only
    primitives and types without ``__iter__`` (which the coder pickles).
    """
    kind = type(value)
    if kind in _plain_types:
        return True
    if kind is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if kind in _CONTAINERS:
        return all(map(_plain, value))
    if not hasattr(kind, "__iter__"):
        _plain_types.add(kind)
        return True
    return False


def _run(head: tuple[bytes, bytes], values: list[Any], micros: list[int]) -> bytes:
    """One run: the header, then the values pickled as Beam's ``PickleCoder`` pickles."""
    windows, pane = head
    times = np.maximum(np.array(micros, dtype=np.int64), _MIN_MICROS)
    # Beam's encoding: milliseconds rounded toward zero, shifted, big-endian.
    millis = np.where(times < 0, (times + 999) // 1000, times // 1000)
    return b"".join(
        (
            _MAGIC,
            _HEADER.pack(len(windows), len(pane), len(values)),
            windows,
            pane,
            (millis ^ _TIME_SHIFT).astype(">i8").tobytes(),
            pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL),
        )
    )


def _parts(run: bytes) -> tuple[bytes, bytes, np.ndarray, int]:
    """A run's windows' and pane's bytes, its elements' encoded times, its values' offset."""
    if run[:2] != _MAGIC:
        raise ValueError(f"expected a pickled run (starting {_MAGIC!r}), found {run[:2]!r}")
    windows_length, pane_length, count = _HEADER.unpack_from(run, 2)
    start = 2 + _HEADER.size
    windows = run[start : start + windows_length]
    start += windows_length
    pane = run[start : start + pane_length]
    start += pane_length
    times = np.frombuffer(run, dtype=">i8", count=count, offset=start)
    return windows, pane, times, start + 8 * count


def _micros(times: np.ndarray) -> np.ndarray:
    """Encoded times as Beam's decoding gives them, in microseconds."""
    millis = times.astype(np.int64) ^ _TIME_SHIFT
    return np.where(
        millis <= _MIN_MILLIS,
        _MIN_MICROS,
        np.where(millis >= _MAX_MILLIS, _MAX_MICROS, millis * 1000),
    )


def run_header(run: bytes) -> tuple[bytes, int]:
    """A run's windows' bytes (``WindowedHeaders.header``'s) and its earliest timestamp (µs)."""
    windows, _, times, _ = _parts(run)
    return windows, int(_micros(times).min())


def framed_runs(data: bytes | memoryview) -> Iterator[bytes]:
    """The runs of ``data``: runs one after another, each after its length (``frame``)."""
    position, end = 0, len(data)
    while position < end:
        (length,) = _LENGTH.unpack_from(data, position)
        position += _LENGTH.size
        yield bytes(data[position : position + length])
        position += length


_LENGTH = struct.Struct(">I")


def frame(run: bytes) -> bytes:
    """``run`` after its length, as ``framed_runs`` reads it."""
    return _LENGTH.pack(len(run)) + run


class RunReader:
    """The windowed values of runs, as Beam's windowed-value coder ``coder`` decodes them."""

    def __init__(self, coder: Any) -> None:
        self._windows = bi.WindowsAndPane(coder.window_coder)
        self._impl = coder.get_impl()
        self.decode_all = self._impl.decode_all
        self._decoded: dict[tuple[bytes, bytes], tuple[Any, Any]] = {}

    def values(self, run: bytes) -> list[Any]:
        """The windowed values of one run, in order."""
        windows_bytes, pane_bytes, times, start = _parts(run)
        key = (windows_bytes, pane_bytes)
        decoded = self._decoded.get(key)
        if decoded is None:
            if len(self._decoded) >= 1024:
                self._decoded.clear()
            decoded = self._decoded[key] = self._windows.decode(windows_bytes, pane_bytes)
        windows, pane = decoded
        values = pickle.loads(memoryview(run)[start:])
        make = bi.create_windowed_value
        return [
            make(value, micros, windows, pane)
            for value, micros in zip(values, _micros(times).tolist(), strict=True)
        ]

    def encoded(self, run: bytes) -> bytes:
        """One run's elements encoded by Beam's coder, concatenated."""
        out = bi.create_OutputStream()
        encode = self._impl.encode_to_stream
        for value in self.values(run):
            encode(value, out, True)
        return out.get()


# A stored chunk of pieces, some of them runs: each piece after its length (``frame``).
_PIECES = b"\xff\x02"


def stored(pieces: list[bytes]) -> bytes:
    """Pieces (runs, or elements Beam's coder encoded) as one chunk ``pieces`` reads.

    Without a run, the elements concatenated, as they were stored before runs.
    """
    if not any(map(is_run, pieces)):
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return b"".join([_PIECES, *map(frame, pieces)])


def pieces(chunk: bytes) -> list[bytes]:
    """The pieces ``stored`` made a chunk of (a run or encoded elements: the chunk)."""
    if chunk[:2] == _PIECES:
        return list(framed_runs(memoryview(chunk)[2:]))
    return [chunk]


class RunsInput:
    """A bundle's input of pieces: runs and encoded elements, in order.

    Iterated, it gives them encoded (the bundle processor's data input reads them so); the
    batched steps ask for the windowed values (``execution.batched_steps.ValuesInput``).
    """

    def __init__(self, pieces: list[bytes], reader: RunReader) -> None:
        self.pieces = pieces
        self.reader = reader

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.pieces:
            yield self.reader.encoded(piece) if is_run(piece) else piece

    def windowed_values(self) -> Iterator[Any]:
        """The values Beam's coder would decode from the encoded pieces, in order."""
        return itertools.chain.from_iterable(map(self._values, self.pieces))

    def _values(self, piece: bytes) -> Iterable[Any]:
        return self.reader.values(piece) if is_run(piece) else self.reader.decode_all(piece)


def bundle_input(chunks: list[bytes], reader: RunReader | None) -> bytes | RunsInput:
    """Chunks of runs and encoded elements (``stored``'s, or pieces) as a bundle's input.

    ``reader``: the runs' reader, None where the input's coder takes no runs: only Beam's
    windowed-value coder's encoded elements never start as a run does (``is_run``).
    """
    if reader is None or not any(map(is_run, chunks)):
        return b"".join(chunks)
    return RunsInput([piece for chunk in chunks for piece in pieces(chunk)], reader)
