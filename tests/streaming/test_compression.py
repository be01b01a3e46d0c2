"""A shard's state value and buffered chunks, compressed in the state store."""

from __future__ import annotations

import contextlib
import pickle
import struct
from typing import Any

import pytest
from apache_beam.coders import coders
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from tests.list_states import ListState

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip("streaming needs PySpark 3.5+", allow_module_level=True)

from beam_spark_runner.streaming import compression, levels  # noqa: E402
from beam_spark_runner.streaming.chunk_lists import ListStateChunks  # noqa: E402


class Bid:
    """A value of a class with no coder, pickled by Beam's ``FastPrimitivesCoder``."""

    def __init__(self, auction: int, price: int, at: Timestamp) -> None:
        self.auction = auction
        self.price = price
        self.date_time = at
        self.extra = "abcdefghijklm"


def _framed_bids(count: int) -> bytes:
    """A side-input stage's framed run of windowed bids, as the waiting list holds them."""
    coder = coders.WindowedValueCoder(coders.FastPrimitivesCoder(), coders.IntervalWindowCoder())
    impl = coder.get_impl()
    window = IntervalWindow(1_700_000_000, 1_700_000_010)
    encoded = []
    for n in range(count):
        at = Timestamp(micros=1_700_000_000_000_000 + n * 997)
        element = impl.encode_nested(WindowedValue(Bid(n % 1000, 100 + n % 77, at), at, [window]))
        encoded.append(struct.pack(">I", len(element)) + element)
    return b"".join(encoded)


def test_a_long_value_is_stored_compressed_and_read_back_whole() -> None:
    chunk = _framed_bids(2_000)
    stored = compression.pack(chunk)
    assert stored.startswith(compression._MAGIC)
    # Pickled objects repeat their class and field names: far fewer bytes cross from the
    # JVM (measured 16x on Nexmark q7's bids).
    assert len(stored) * 5 < len(chunk)
    assert compression.unpack(stored) == chunk


def test_a_short_value_is_stored_as_it_is() -> None:
    value = pickle.dumps({"watermark": 5}, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(value) < compression.PACK_AT_LEAST
    assert compression.pack(value) == value
    assert compression.unpack(value) == value


def test_values_an_earlier_version_wrote_are_read_unchanged() -> None:
    # Shard states were pickles; a side-input stage's chunks framed runs, whose first four
    # bytes are a length: neither can start as a packed value does.
    state = pickle.dumps(list(range(1_000)), protocol=pickle.HIGHEST_PROTOCOL)
    run = _framed_bids(50)
    for value in (state, run):
        assert len(value) >= compression.PACK_AT_LEAST
        assert compression.unpack(value) == value
    largest_binary = struct.pack(">I", 2**31 - 1)  # a Spark binary value is under 2 GiB
    assert largest_binary < compression._MAGIC
    assert not state.startswith(compression._MAGIC[:1])


def test_the_waiting_list_holds_chunks_compressed_and_puts_back_what_it_keeps() -> None:
    list_state = ListState()
    chunks = ListStateChunks(list_state)
    first, second, small = _framed_bids(300), _framed_bids(400), b"\x00\x00\x00\x01x"
    chunks.append([(b"a", first), (b"b", second), (b"a", small)])
    assert list_state.rows is not None
    stored = dict(list_state.rows[:2])
    assert all(len(stored[tag]) * 5 < len(raw) for tag, raw in ((b"a", first), (b"b", second)))
    assert chunks.take({b"a"}) == {b"a": [first, small]}
    # What stays is put back as it was stored, not compressed again.
    assert list_state.rows == [(b"b", stored[b"b"])]
    assert chunks.take({b"b"}) == {b"b": [second]}
    assert list_state.rows is None


def test_the_waiting_list_takes_chunks_an_earlier_version_stored_uncompressed() -> None:
    list_state = ListState()
    old = _framed_bids(300)
    list_state.rows = [(b"a", old)]
    chunks = ListStateChunks(list_state)
    chunks.append([(b"a", _framed_bids(5))])
    assert chunks.take({b"a"}) == {b"a": [old, _framed_bids(5)]}


class _ValueState:
    """PySpark's ``ValueState`` of a shard: one row of one binary column."""

    def __init__(self, value: bytes | None) -> None:
        self.value = value

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[bytes]:
        assert self.value is not None
        return (self.value,)

    def update(self, row: tuple[bytes]) -> None:
        self.value = row[0]


class _ShardState:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def encode(self) -> bytes:
        return self.payload

    @staticmethod
    def decode(data: bytes) -> _ShardState:
        return _ShardState(data)


class _Topology:
    nodes = {7: "a stage with side inputs"}


@pytest.mark.parametrize("written_by", ["the layout before the log", "an earlier version"])
def test_a_level_reads_a_value_written_whole_and_writes_it_compressed_as_a_base(
    written_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value written whole (compressed, or before compression) is read; the state goes
    back compressed, as the base of the shard's change log (``state_cache``)."""
    previous = _framed_bids(200)
    seen: list[bytes] = []

    class _SideInputShard:
        def __init__(self, spec: Any, sinks: Any, store: Any) -> None:
            pass

        def storing(self) -> Any:
            return contextlib.nullcontext()

        def decode(self, data: bytes) -> _ShardState:
            state = _ShardState.decode(data)
            seen.append(state.payload)
            return state

        def encode(self, state: _ShardState) -> bytes:
            return state.encode()

        def run(self, topology: Any, node: Any, shard: int, state: Any, rows: Any) -> Any:
            assert state is not None
            return _ShardState(state.payload + b"!"), []

        def changes(self, state: _ShardState) -> bytes:
            return b""

        def release(self, state: _ShardState) -> None:
            pass

    monkeypatch.setattr(levels, "SideInputShard", _SideInputShard)
    level = levels.Level(_Topology(), {}, {}, {}, {7: "spec"}, None)  # type: ignore[arg-type, dict-item]
    whole = compression.pack(previous) if written_by != "an earlier version" else previous
    value, log = _ValueState(whole), ListState()
    level.bind(value, ListState(), log)
    assert level._run_shard(7, 0, iter([])) == []
    assert seen == [previous]
    assert log.rows is not None
    (base,) = [bytes(row[0]) for row in log.rows]
    assert base[:1] == b"B" and base[1:].startswith(compression._MAGIC)
    assert compression.unpack(base[1:]) == previous + b"!"
