"""``beam_internals``' shortcuts give what Beam's own constructors give."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from apache_beam.coders import coders
from apache_beam.internal import pickler
from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.transforms import sideinputs, window
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, WindowedValue

from beam_spark_runner import beam_internals as bi


@pytest.mark.parametrize(
    "micros",
    [
        0,
        1,
        -1,
        999_999,
        -1_000_001,
        1_767_225_600_123_456,
        MIN_TIMESTAMP.micros,
        MAX_TIMESTAMP.micros,
    ],
)
def test_timestamp_of_micros_is_beams_timestamp(micros: int) -> None:
    made = bi.timestamp_of_micros(micros)
    expected = Timestamp(micros=micros)
    assert type(made) is Timestamp
    assert vars(made) == vars(expected)
    assert made == expected and made.micros == micros and hash(made) == hash(expected)
    assert repr(made) == repr(expected)


@pytest.mark.parametrize(
    "timestamp",
    [
        Timestamp(micros=0),
        Timestamp(micros=-1),
        Timestamp(micros=1_767_225_600_123_456),
        Timestamp.of(-2.375),
        Timestamp.of(1.5),
        MIN_TIMESTAMP,
        MAX_TIMESTAMP,
    ],
    ids=repr,
)
def test_micros_of_timestamp_is_beams_micros(timestamp: Timestamp) -> None:
    assert bi.micros_of_timestamp(timestamp) == timestamp.micros


def test_micros_of_a_timestamp_finer_than_micros_fails_as_beams_does() -> None:
    try:
        finer = Timestamp(1, 123_456_789, precision=9)
    except TypeError:
        pytest.skip("this Beam's Timestamp has no precision (microseconds only)")
    with pytest.raises(ValueError, match="greater than microsecond precision"):
        bi.micros_of_timestamp(finer)


_WINDOWINGS = [
    (coders.GlobalWindowCoder(), [[GlobalWindow()]]),
    (
        coders.IntervalWindowCoder(),
        [
            [IntervalWindow(0, 10)],
            [IntervalWindow(0, 10)],
            [IntervalWindow(-20, -10), IntervalWindow(5, 15)],
            [IntervalWindow(-20, -10)],
            [],
            [IntervalWindow(0, 10)],
        ],
    ),
]


@pytest.mark.parametrize(("window_coder", "window_sets"), _WINDOWINGS)
def test_windowed_headers_are_what_beams_decoding_gives_without_the_value(
    window_coder: Any, window_sets: list[list[Any]]
) -> None:
    coder = coders.WindowedValueCoder(coders.PickleCoder(), window_coder)
    impl = coder.get_impl()
    timestamps = [
        Timestamp(0),
        Timestamp(micros=-1_234_567),
        Timestamp(1_767_225_600.123456),
        MIN_TIMESTAMP,
        MAX_TIMESTAMP,
        Timestamp(micros=MIN_TIMESTAMP.micros + 1000),
    ]
    headers = bi.WindowedHeaders.of(coder)
    assert headers is not None
    # Elements one after the other, as a run: some share the previous one's windows.
    for i, timestamp in enumerate(timestamps * len(window_sets)):
        windows = window_sets[i % len(window_sets)]
        pane = PaneInfo(i % 2 == 0, False, 1, i, 0)
        element = impl.encode_nested(WindowedValue({"value": [i]}, timestamp, windows, pane))
        decoded = impl.decode_nested(element)
        micros, windows_bytes = headers.header(element)
        assert micros == decoded.timestamp.micros
        assert headers.windows(windows_bytes) == tuple(decoded.windows)


def test_framed_groups_cut_a_framed_run_where_the_group_of_its_windows_changes() -> None:
    """One loop over a framed run gives what ``header`` gives element by element: pieces
    of neighbours whose windows map to one group (asked once per change of windows), each
    with its elements and their earliest timestamp, Beam's bounds included."""
    import struct

    coder = coders.WindowedValueCoder(coders.PickleCoder(), coders.IntervalWindowCoder())
    impl = coder.get_impl()
    a, a2, b = IntervalWindow(0, 10), IntervalWindow(5, 10), IntervalWindow(10, 20)
    elements = [
        (Timestamp(7), a),
        (MIN_TIMESTAMP, a),
        (Timestamp(3), a2),  # other windows, the same group: the piece goes on
        (Timestamp(12), b),
        (MAX_TIMESTAMP, b),
        (Timestamp(4), a),
    ]
    encoded = [impl.encode_nested(WindowedValue(i, t, [w])) for i, (t, w) in enumerate(elements)]
    frame = struct.Struct(">I")
    run = b"".join(frame.pack(len(e)) + e for e in encoded)
    headers = bi.WindowedHeaders.of(coder)
    assert headers is not None
    asked: list[tuple[Any, ...]] = []

    def group_of(windows: bytes) -> int:
        (window_,) = headers.windows(windows)
        asked.append((window_,))
        return int(window_.end)

    assert headers.framed_groups(run, frame, group_of) == [
        (b"".join(encoded[:3]), MIN_TIMESTAMP.micros, 10),
        (b"".join(encoded[3:5]), 12_000_000, 20),
        (encoded[5], 4_000_000, 10),
    ]
    assert asked == [(a,), (a2,), (b,), (a,)]
    assert [headers.header(e)[0] for e in encoded[1:5:3]] == [
        MIN_TIMESTAMP.micros,
        MAX_TIMESTAMP.micros,
    ]


def test_a_parameterized_windowed_coder_has_no_header() -> None:
    coder = coders.ParamWindowedValueCoder(
        bi.global_window_param_payload(), [coders.BytesCoder(), coders.GlobalWindowCoder()]
    )
    assert bi.WindowedHeaders.of(coder) is None


class _Methods:
    """A method and a classmethod with plain defaults, bound and unbound."""

    def process(self, element: Any, ts: Any = None, count: int = 3) -> None:
        pass

    @classmethod
    def make(cls, a: int, b: int = 1) -> None:
        pass


def _plain(a: Any, b: Any = 2, *rest: Any, c: Any = 3) -> None:
    pass


def _memo_over_counter(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, install: Callable[[], None]
) -> tuple[Any, Any, list[Any]]:
    """Installs a memo over a counter of Beam's ``module.name``: (memo, Beam's, calls).

    Installing twice wraps it once. Undone after the test.
    """
    calls: list[Any] = []
    unmemoized = getattr(module, name)

    def counted(argument: Any) -> Any:
        calls.append(argument)
        return unmemoized(argument)

    monkeypatch.setattr(module, name, counted)
    install()
    memo = getattr(module, name)
    assert memo is not counted
    install()  # once per process: not wrapped twice
    assert getattr(module, name) is memo
    return memo, unmemoized, calls


def test_remembered_signatures_are_beams_and_follow_changed_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import functools

    from apache_beam.transforms import core

    memo, unmemoized, calls = _memo_over_counter(
        monkeypatch, core, "get_function_args_defaults", bi.cache_function_signatures
    )

    obj = _Methods()
    cases = [_plain, obj.process, _Methods.make, _Methods.process]
    for f in cases:
        assert memo(f) == unmemoized(f)
    assert len(calls) == len(cases)
    for f in cases:  # hits: the same answers, without Beam's inspection
        assert memo(f) == unmemoized(f)
    assert len(calls) == len(cases)
    # A bound method and its function differ by the first argument: two entries.
    assert memo(obj.process)[0] == ["element", "ts", "count"]
    assert memo(_Methods.process)[0] == ["self", "element", "ts", "count"]

    # Callers get their own lists.
    memo(_plain)[1].append("mutated")
    assert memo(_plain) == (["a", "b"], [2])

    # New defaults (or code) on the same function object are inspected again.
    _plain.__defaults__ = (5,)
    try:
        assert memo(_plain) == (["a", "b"], [5])
    finally:
        _plain.__defaults__ = (2,)
    assert memo(_plain) == (["a", "b"], [2])

    # Wrappers and other callables are never remembered.
    @functools.wraps(_plain)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        pass

    before = len(calls)
    for f in (wrapper, wrapper, len, len, functools.partial(_plain, 1)):
        assert memo(f) == unmemoized(f)
    assert len(calls) == before + 5


def test_remembered_signatures_give_beams_dofn_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import apache_beam as beam
    from apache_beam.runners import common
    from apache_beam.transforms import core, userstate

    spec = userstate.BagStateSpec("seen", coders.VarIntCoder())

    class StatefulDoFn(beam.DoFn):
        def process(self, element: Any, seen: Any = beam.DoFn.StateParam(spec)) -> None:
            pass

    def describe(dofn: Any) -> tuple[Any, ...]:
        signature = common.DoFnSignature(dofn)
        return (
            signature.is_stateful_dofn(),
            signature.process_method.args,
            signature.process_method.defaults,
            userstate.get_dofn_specs(dofn),
        )

    dofns = [StatefulDoFn(), beam.Map(lambda x, t=beam.DoFn.TimestampParam: x).fn]
    expected = [describe(d) for d in dofns]
    # Undone after the test, should this install the memo (it may be installed already).
    monkeypatch.setattr(core, "get_function_args_defaults", core.get_function_args_defaults)
    bi.cache_function_signatures()
    for _ in range(2):
        assert [describe(d) for d in dofns] == expected
    assert expected[0][0] is True and expected[0][3] == ({spec}, set())


def test_remembered_dofn_specs_are_beams_per_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    import apache_beam as beam
    from apache_beam.transforms import core, userstate

    spec = userstate.BagStateSpec("seen", coders.VarIntCoder())
    timer = userstate.TimerSpec("t", userstate.TimeDomain.WATERMARK)

    class Stateful(beam.DoFn):
        def process(self, element: Any, seen: Any = beam.DoFn.StateParam(spec)) -> None:
            pass

    class Timed:
        def method(self, element: Any, t: Any = beam.DoFn.TimerParam(timer)) -> None:
            pass

    class Equal(beam.DoFn):  # __eq__ without __hash__: unhashable
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Equal)

        def process(self, element: Any) -> None:
            pass

    memo, unmemoized, calls = _memo_over_counter(
        monkeypatch,
        userstate,
        "get_dofn_specs",
        bi.remember_dofn_specs,
    )

    dofns = [Stateful(), Stateful(), beam.Map(lambda x: x).fn, Equal()]
    for dofn in dofns:
        assert memo(dofn) == unmemoized(dofn)
    assert len(calls) == len(dofns)  # two instances of one class: asked each
    for dofn in dofns:  # hits: the same answers, without Beam's walk
        assert memo(dofn) == unmemoized(dofn)
        assert userstate.is_stateful_dofn(dofn) == isinstance(dofn, Stateful)
    assert len(calls) == len(dofns)

    # Callers get sets of their own.
    memo(dofns[0])[0].clear()
    assert memo(dofns[0]) == ({spec}, set())

    # FlatMap(obj.method)'s DoFn holds the bound method as ``process``: another one is
    # asked again.
    mapped = core.CallableWrapperDoFn(Timed().method)
    assert memo(mapped) == (set(), {timer})
    before = len(calls)
    mapped.process = Timed().method
    assert memo(mapped) == (set(), {timer})
    assert len(calls) == before + 1
    mapped.process = lambda element: None
    mapped._fn = mapped.process  # noqa: SLF001 - Beam walks every attribute's method
    assert memo(mapped) == unmemoized(mapped) == (set(), set())
    assert len(calls) == before + 2


def test_the_bundle_processor_cache_starts_no_thread_of_its_own() -> None:
    import threading

    from apache_beam.runners.worker.data_plane import PeriodicThread

    def periodic() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if isinstance(t, PeriodicThread)]

    before = periodic()
    cache = bi.BundleProcessorCache(
        bi.FNAPI_RUNNER_CAPABILITIES, None, None, {}, sampling_period_ms=20
    )
    assert cache.periodic_shutdown is None
    assert periodic() == before
    cache.shutdown()


def test_processors_built_after_side_inputs_change_resolve_them_per_element_and_beam_is_back() -> (
    None
):
    from apache_beam.options.value_provider import RuntimeValueProvider

    seen: list[bool] = []

    class Recording(bi.BundleProcessorCache):  # type: ignore[misc]
        def _build(self) -> None:
            seen.append("disable_global_windowed_args_caching" in RuntimeValueProvider.experiments)

    before = RuntimeValueProvider.experiments
    cache = Recording(bi.FNAPI_RUNNER_CAPABILITIES, None, None, {}, sampling_period_ms=20)
    # Beam's get builds a processor for an unknown instruction: stand in for the build.
    base = bi.BundleProcessorCache.__mro__[1]
    original = base.get
    base.get = lambda self, *args: self._build()  # type: ignore[method-assign]
    try:
        cache.get("1", "d")
        cache.side_inputs_change = True
        cache.get("2", "d")
    finally:
        base.get = original  # type: ignore[method-assign]
        cache.shutdown()
    assert seen == [False, True]
    assert RuntimeValueProvider.experiments == before


@pytest.fixture
def counted_views(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[type]]:
    """The option-view memo of one pipeline, in force over a counter of Beam's ``view_as``.

    Yields the classes Beam's method was called for through the memo; Beam's method is
    back after the test.
    """
    from apache_beam.options import pipeline_options as po

    beams = po.PipelineOptions.view_as
    calls: list[type] = []

    def counted(self: Any, cls: Any) -> Any:
        calls.append(cls)
        return beams(self, cls)

    counted.__wrapped__ = beams  # type: ignore[attr-defined]

    monkeypatch.setattr(po.PipelineOptions, "view_as", counted)
    views = bi.OptionViews()
    with bi.option_views(views):
        assert po.PipelineOptions.view_as is not counted
        memo = po.PipelineOptions.view_as
        with bi.option_views(views):  # nested: not wrapped twice
            assert po.PipelineOptions.view_as is memo
        yield calls
    assert po.PipelineOptions.view_as is counted


def _view_facts(view: Any) -> tuple[Any, ...]:
    names = view._visible_option_list()
    return (type(view), names, {name: getattr(view, name) for name in names})


def test_remembered_option_views_are_beams_views(counted_views: list[type]) -> None:
    from apache_beam.options import pipeline_options as po

    beams = po.PipelineOptions.view_as.__wrapped__.__wrapped__  # under the memo and counter
    flags = ["--experiments=a,b", "--streaming", "--job_name=j", "--unknown_flag=3"]
    classes = [po.TypeOptions, po.StandardOptions, po.DebugOptions, po.WorkerOptions]
    mine, theirs = po.PipelineOptions(flags), po.PipelineOptions(list(flags))
    for _ in range(3):
        for cls in classes:
            view, expected = mine.view_as(cls), beams(theirs, cls)
            assert _view_facts(view) == _view_facts(expected)
            assert view._flags is mine._flags and view._all_options is mine._all_options
    assert mine._all_options == theirs._all_options
    # Beam parsed each class once; every later view came from the memo.
    assert counted_views == classes


def test_a_remembered_view_shares_the_options_store(counted_views: list[type]) -> None:
    from apache_beam.options import pipeline_options as po

    options = po.PipelineOptions(["--experiments=a"], pipeline_type_check=False)
    debug = options.view_as(po.DebugOptions)
    debug.add_experiment("b")
    assert options.view_as(po.TypeOptions).pipeline_type_check is False  # the kwarg kept
    options.view_as(po.TypeOptions).pipeline_type_check = True
    assert options.view_as(po.TypeOptions).pipeline_type_check is True
    assert options.view_as(po.DebugOptions).experiments == ["a", "b"]
    # Another options object with the same flags has its own values, as parsed: the
    # memo's parse, copied (each class was parsed once).
    other = po.PipelineOptions(["--experiments=a"])
    experiments = other.view_as(po.DebugOptions).experiments
    assert experiments == ["a"]
    experiments.append("c")
    assert other.view_as(po.DebugOptions).experiments == ["a", "c"]
    assert options.view_as(po.DebugOptions).experiments == ["a", "b"]
    assert other.view_as(po.TypeOptions).pipeline_type_check is True  # Beam's default
    assert po.PipelineOptions(["--experiments=a"]).view_as(po.DebugOptions).experiments == ["a"]
    assert counted_views == [po.DebugOptions, po.TypeOptions]


def test_beams_view_runs_where_the_memo_would_not_be_exact(counted_views: list[type]) -> None:
    from apache_beam.options import pipeline_options as po

    class OwnInit(po.PipelineOptions):
        def __init__(self, flags: Any = None, **kwargs: Any) -> None:
            super().__init__(flags, **kwargs)
            object.__setattr__(self, "_made_by_init", True)

        @classmethod
        def _add_argparse_args(cls, parser: Any) -> None:
            parser.add_argument("--own_value", default="x")

    options = po.PipelineOptions(["--own_value=y"])
    for _ in range(2):
        view = options.view_as(OwnInit)
        assert view.own_value == "y" and view._made_by_init
    # Flags that are not a list of strings are parsed each time.
    odd = po.PipelineOptions(("--job_name", "j"))
    odd._flags = iter(["--job_name", "j"])
    odd.view_as(po.GoogleCloudOptions)
    odd.view_as(po.GoogleCloudOptions)
    # A name taken out of the store is stored again, as Beam's view does (from the memo's
    # parse: the flags are the same).
    typed = po.PipelineOptions([])
    typed.view_as(po.TypeOptions)
    del typed._all_options["pipeline_type_check"]
    assert typed.view_as(po.TypeOptions).pipeline_type_check is True
    assert counted_views == [OwnInit, OwnInit] + [po.GoogleCloudOptions] * 2 + [po.TypeOptions]


def test_the_runner_remembers_option_views_only_while_it_applies_a_transform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import apache_beam as beam
    from apache_beam.options import pipeline_options as po

    from beam_spark_runner.runner import SparkStructuredRunner

    beams = po.PipelineOptions.view_as
    seen: list[Any] = []

    class Probe(beam.PTransform):  # type: ignore[misc]
        def expand(self, pbegin: Any) -> Any:
            seen.append(po.PipelineOptions.view_as)
            return pbegin | beam.Create([1])

    p = beam.Pipeline(runner=SparkStructuredRunner(), options=po.PipelineOptions([]))
    _ = p | Probe()
    assert seen and seen[0] is not beams and seen[0].__wrapped__ is beams
    assert po.PipelineOptions.view_as is beams


def test_a_later_pipeline_reads_option_defaults_from_the_environment_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.direct.direct_runner import DirectRunner

    from beam_spark_runner.options import BATCHED_STEPS_ENV, SparkRunnerOptions
    from beam_spark_runner.runner import SparkStructuredRunner

    monkeypatch.setenv(BATCHED_STEPS_ENV, "on")
    p = beam.Pipeline(runner=SparkStructuredRunner(), options=PipelineOptions([]))
    _ = p | beam.Create([1, 2]) | beam.Map(str)
    assert p.options.view_as(SparkRunnerOptions).spark_batched_steps == "on"
    monkeypatch.setenv(BATCHED_STEPS_ENV, "off")
    later = beam.Pipeline(runner=DirectRunner(), options=PipelineOptions([]))
    _ = later | beam.Create([1])
    assert later.options.view_as(SparkRunnerOptions).spark_batched_steps == "off"
    assert PipelineOptions([]).view_as(SparkRunnerOptions).spark_batched_steps == "off"


def test_the_drivers_signature_memos_last_only_while_a_run_is_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apache_beam.transforms import core, userstate

    # Functions as Beam's are, whatever memos earlier tests installed for the process.
    inspect_args, inspect_specs = core.get_function_args_defaults, userstate.get_dofn_specs
    monkeypatch.setattr(core, "get_function_args_defaults", lambda f: inspect_args(f))
    monkeypatch.setattr(userstate, "get_dofn_specs", lambda dofn: inspect_specs(dofn))
    beams = core.get_function_args_defaults, userstate.get_dofn_specs
    with bi.signature_memos():
        with bi.signature_memos():  # an overlapping run shares them
            assert core.get_function_args_defaults is not beams[0]
            assert userstate.get_dofn_specs is not beams[1]
        assert core.get_function_args_defaults is not beams[0]
    assert (core.get_function_args_defaults, userstate.get_dofn_specs) == beams


@pytest.mark.spark
def test_a_pipeline_run_leaves_beams_dofn_inspection_as_it_found_it() -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms import core, userstate

    from tests.conftest import SPARK_TEST_MASTER

    beams = core.get_function_args_defaults, userstate.get_dofn_specs
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}"]
    )
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create([1, 2]) | beam.Map(lambda x: x + 1)
    assert (core.get_function_args_defaults, userstate.get_dofn_specs) == beams


def test_beams_default_window_mappings_are_known_through_the_pickled_spec() -> None:
    def carried(mapping: Callable[[Any], Any]) -> Callable[[Any], Any]:
        spec = beam_runner_api_pb2.FunctionSpec(
            urn=python_urns.PICKLED_WINDOW_MAPPING_FN, payload=pickler.dumps(mapping)
        )
        return bi.window_mapping_fn(spec)

    for window_fn in (window.FixedWindows(5), window.SlidingWindows(10, 5), window.GlobalWindows()):
        assert bi.maps_via_end(carried(sideinputs.default_window_mapping_fn(window_fn)))
    assert not bi.maps_via_end(carried(lambda main_window: main_window))
