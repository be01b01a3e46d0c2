"""The runner's native read of a plain ReadFromText (planning.native_text_reads).

The lines, their record boundaries across byte ranges, and their encoding must be exactly
what Beam's own read gives; reads the native path does not cover keep Beam's expansion.
"""

from __future__ import annotations

import gzip
import random
import typing

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.io.textio import _TextSource
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.data_channel import ArrowDataChannel
from beam_spark_runner.execution.text_read import (
    LineEncoder,
    TextRange,
    read_lines,
    split_ranges,
)
from beam_spark_runner.planning import TEXT_READ_URN, build_plan

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _beam_records(path: str, start: int, end: int) -> list[bytes]:
    source = _TextSource(path, 0, "auto", True, coders.BytesCoder(), validate=False)
    return list(source.read_records(path, OffsetRangeTracker(start, end)))


def test_lines_and_range_boundaries_are_beams(tmp_path: typing.Any) -> None:
    rng = random.Random(7)
    alphabet = [b"a", b"bc", b"\n", b"\r", b"\r\n", b" ", "é".encode()]
    for trial in range(300):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 50)))
        path = tmp_path / f"{trial}.txt"
        path.write_bytes(data)
        cuts = sorted({0, len(data), *(rng.randint(0, len(data)) for _ in range(3))})
        everything = []
        for start, end in zip(cuts, cuts[1:], strict=False):
            block = rng.choice([1, 2, 3, 7, 4096])
            with open(path, "rb") as stream:
                got = [line for lines in read_lines(stream, start, end, block) for line in lines]
            assert got == _beam_records(str(path), start, end), (data, start, end, block)
            everything.extend(got)
        if data:
            assert everything == _beam_records(str(path), 0, len(data)), data


def test_line_encoding_is_the_windowed_str_coders() -> None:
    coder = coders.WindowedValueCoder(coders.StrUtf8Coder(), coders.coders.GlobalWindowCoder())
    impl = coder.get_impl()
    header = impl.encode_nested(GlobalWindows.windowed_value(""))[:-1]
    lines = ["", "a", "é" * 70, "x" * 20_000, "y" * 127, "z" * 128]
    expected = b"".join(impl.encode_nested(GlobalWindows.windowed_value(s)) for s in lines)
    assert LineEncoder(header).encode([s.encode() for s in lines]) == expected


def test_split_ranges_cover_every_byte_once() -> None:
    files = [("a", 0), ("b", 10), ("c", (5 << 20) + 3)]
    ranges = split_ranges(files, 2)
    assert all(r.path != "a" for r in ranges)  # empty files hold no records
    for path, size in files[1:]:
        mine = [r for r in ranges if r.path == path]
        assert mine[0].start == 0 and mine[-1].end == size
        assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
    assert len([r for r in ranges if r.path == "c"]) == 2  # one per task for a big file
    assert TextRange.decode(ranges[0].encode()) == ranges[0]
    assert split_ranges([("a", 0)], 2) == []


def test_lazy_input_is_read_only_when_the_bundle_reads_it() -> None:
    channel = ArrowDataChannel()
    produced = []

    def chunks() -> typing.Iterator[bytes]:
        for chunk in (b"ab", b"", b"cd"):
            produced.append(chunk)
            yield chunk

    channel.set_input("i1", "t", chunks())
    assert produced == []
    assert [d.data for d in channel.input_elements("i1", [])] == [b"ab", b"cd"]


def _stage_inputs(p: beam.Pipeline) -> list[bytes]:
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    return [stage.input_buffer_id for stage in build_plan(proto).stages]


def test_only_plain_uncompressed_reads_are_native(tmp_path: typing.Any) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("a\nb\n")
    packed = tmp_path / "packed.txt.gz"
    packed.write_bytes(gzip.compress(b"a\nb\n"))

    def read_kinds(read: beam.PTransform, as_side_input: bool = False) -> list[str]:
        p = beam.Pipeline()
        lines = p | read
        if as_side_input:
            _ = p | beam.Create([1]) | beam.Map(lambda x, s: x, beam.pvalue.AsList(lines))
        else:
            _ = lines | beam.Map(len)
        return [
            bi.split_buffer_id(b)[0] if b != bi.IMPULSE_BUFFER else "impulse"
            for b in _stage_inputs(p)
        ]

    assert "textread" in read_kinds(beam.io.ReadFromText(str(plain)))
    assert "textread" not in read_kinds(beam.io.ReadFromText(str(packed)))
    assert "textread" not in read_kinds(beam.io.ReadFromText(str(plain), skip_header_lines=1))
    assert "textread" not in read_kinds(beam.io.ReadFromTextWithFilename(str(plain)))
    assert "textread" not in read_kinds(beam.io.ReadFromText(str(plain)), as_side_input=True)
    assert TEXT_READ_URN.startswith("beam:runner:spark:")


def _described_lines(p: beam.Pipeline, pattern: str) -> beam.PCollection:
    def describe(
        line: str,
        timestamp: typing.Any = beam.DoFn.TimestampParam,
        window: typing.Any = beam.DoFn.WindowParam,
        pane: typing.Any = beam.DoFn.PaneInfoParam,
    ) -> tuple[str, str, str, str]:
        return line, repr(timestamp), repr(window), repr(pane)

    return p | beam.io.ReadFromText(pattern) | beam.Map(describe)


@pytest.mark.spark
@pytest.mark.parametrize("compressed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_read_gives_what_direct_runner_gives(tmp_path: typing.Any, compressed: bool) -> None:
    rng = random.Random(3)
    # Long lines: a 2.8 MB file in few elements, split into two byte ranges on local[2].
    pieces = ["w" * 500, "é" * 100, " ", "\r", "\n", "\r\n", "\n\n"]
    expected = []
    (tmp_path / "in").mkdir()
    for index, count in enumerate([20_000, 2_000, 3]):
        text = "".join(rng.choice(pieces) for _ in range(count)) + rng.choice(["", "tail"])
        plain = tmp_path / f"plain-{index}.txt"
        plain.write_bytes(text.encode())
        expected.extend(r.decode() for r in _beam_records(str(plain), 0, plain.stat().st_size))
        if compressed:
            (tmp_path / "in" / f"{index}.txt.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (tmp_path / "in" / f"{index}.txt").write_bytes(text.encode())
    (tmp_path / "in" / "empty.txt").write_bytes(b"")
    pattern = str(tmp_path / "in" / "*")
    assert len(expected) > 10_000
    in_global_window = [
        (line, repr(MIN_TIMESTAMP), repr(GlobalWindow()), repr(PANE_INFO_UNKNOWN))
        for line in expected
    ]

    with beam.Pipeline(runner=FnApiRunner()) as p:  # the reference: Beam's own read
        assert_that(_described_lines(p, pattern), equal_to(in_global_window))
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    assert_that(_described_lines(p, pattern), equal_to(in_global_window))
    p.run().wait_until_finish()
