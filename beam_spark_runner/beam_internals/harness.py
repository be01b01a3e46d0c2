"""The SDK harness's bundle processors, data plane, state handlers and step tracker."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_fn_api_pb2,
)
from apache_beam.runners.portability.fn_api_runner.worker_handlers import (
    StateServicer,
)
from apache_beam.runners.worker import (
    data_plane,
    sdk_worker,
    statecache,
    statesampler,
)

from beam_spark_runner.beam_internals.patches import bundle_sampling_period, side_inputs_per_element

_LOGGER = logging.getLogger(__name__)


ClosableOutputStream = data_plane.ClosableOutputStream
DataChannel = data_plane.DataChannel
DataChannelFactory = data_plane.DataChannelFactory
SdkWorker = sdk_worker.SdkWorker

_LOGGER = logging.getLogger(__name__)

# Monitoring infos of bundles that failed in this process, until a task takes them.
_failed_bundle_infos: list[Any] = []
_failed_bundle_lock = threading.Lock()


# The capability that lets Beam's multimap side inputs read a window's keys and values at once.
_BULK_READ = common_urns.runner_protocols.MULTIMAP_KEYS_VALUES_SIDE_INPUT.urn


class BundleProcessorCache(sdk_worker.BundleProcessorCache):
    """Beam's bundle processor cache, keeping what a failed bundle's metrics had counted.

    (And without Beam's thread per cache: :meth:`_schedule_periodic_shutdown`.)

    When a bundle fails, Beam's ``SdkWorker`` discards its processor and answers with the
    error only: the metrics user code updated before failing are lost. They belong to the
    task attempt's *attempted* metrics, so this cache reads them before the processor is
    shut down; ``take_failed_bundle_monitoring_infos`` hands them to the failing task.
    """

    def __init__(self, *args: Any, sampling_period_ms: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sampling_period_ms = sampling_period_ms
        # Set once the side inputs served to its processors change between bundles.
        self.side_inputs_change = False

    def get(self, instruction_id: str, bundle_descriptor_id: str) -> Any:
        """Beam's ``get``; a processor it builds samples every ``sampling_period_ms``.

        With ``side_inputs_change``, its invokers read globally windowed side inputs per
        element (``patches.side_inputs_per_element``), and a multimap side input key by key:
        Beam's bulk read (where the runner serves a window's keys and values at once) decodes
        every key and value of the window and sizes them for the SDK's cache, which, for side
        inputs that change each micro-batch, costs the whole side input per batch.
        """
        with contextlib.ExitStack() as scope:
            scope.enter_context(bundle_sampling_period(self.sampling_period_ms))
            if self.side_inputs_change:
                scope.enter_context(side_inputs_per_element())
                self.runner_capabilities = self.runner_capabilities - {_BULK_READ}
            return super().get(instruction_id, bundle_descriptor_id)

    def _schedule_periodic_shutdown(self) -> None:
        """Starts no thread: the runner tears idle bundle processors down itself.

        Beam's cache starts a thread per cache, to shut down processors idle for 60 s, and
        ``shutdown`` joins it; each stage worker is a cache, built per stage, run and worker
        process (``stage_worker.StageWorker``). ``stage_worker.tear_down_idle_dofns``
        already tears idle processors down, after the run's ``idle_teardown_seconds``, and a
        stage worker's end shuts its cache down.
        """
        self.periodic_shutdown = None

    def discard(self, instruction_id: str, exception: Exception) -> None:
        """Records the failed bundle's monitoring infos, then discards it as Beam does."""
        entry = self.active_bundle_processors.get(instruction_id)
        if entry is not None:
            try:
                infos = entry[1].monitoring_infos()
            except Exception:  # noqa: BLE001 - metrics must never mask the bundle's error
                _LOGGER.debug("Could not read a failed bundle's metrics", exc_info=True)
            else:
                with _failed_bundle_lock:
                    _failed_bundle_infos.extend(infos)
        super().discard(instruction_id, exception)


def bundle_processors_busy(cache: sdk_worker.BundleProcessorCache) -> bool:
    """Whether a bundle processor cache has a bundle running or a processor being built.

    ``processors_being_created`` only exists from Beam 2.69 on.
    """
    return bool(cache.active_bundle_processors or getattr(cache, "processors_being_created", 0))


def take_failed_bundle_monitoring_infos() -> list[Any]:
    """The monitoring infos of bundles that failed in this process since the last call."""
    with _failed_bundle_lock:
        taken = list(_failed_bundle_infos)
        _failed_bundle_infos.clear()
    return taken


GlobalCachingStateHandler = sdk_worker.GlobalCachingStateHandler
StateHandler = sdk_worker.StateHandler
StateCache = statecache.StateCache


def current_step_name() -> str | None:
    """The Beam step (transform name) running on this thread, as Beam's log handler finds it."""
    tracker = statesampler.get_current_tracker()
    if tracker is None:
        return None
    state = tracker.current_state()
    name_context = getattr(state, "name_context", None) if state is not None else None
    return getattr(name_context, "step_name", None) if name_context is not None else None


def servicer_contents(
    servicer: Any, touched: set[bytes] | None = None
) -> tuple[dict[bytes, list[bytes]], dict[bytes, Any]]:
    """A ``StateServicer``'s cells (state key -> values) and ordered-list indexes, as dicts.

    The value lists are the servicer's own, not copies: the caller drops the servicer
    (``InMemoryStateBackend.export_user_state`` does), so nothing appends to them again.
    With ``touched`` (the cells used since the servicer took its cells, which held no
    empty one), its dict of cells itself, the empty cells among ``touched`` taken out: what
    it costs follows the cells used, not the cells held.
    """
    cells = servicer._state  # noqa: SLF001
    if touched is None:
        cells = {key: values for key, values in cells.items() if values}
    else:
        for key in touched:
            if not cells.get(key, True):
                del cells[key]
    return cells, dict(servicer._ordered_list_keys)  # noqa: SLF001


def servicer_with(contents: tuple[dict[bytes, list[bytes]], dict[bytes, Any]] | None) -> Any:
    """A ``StateServicer`` holding what :func:`servicer_contents` returned.

    It takes the value lists as they are (the caller hands over a decoded copy it does not
    read again), and the dict of cells itself where it is a ``defaultdict(list)`` (as
    ``servicer_contents`` hands it over), or else in a dict of its own.
    """
    servicer = StateServicer()
    if contents:
        cells, ordered = contents
        adopted = isinstance(cells, collections.defaultdict) and cells.default_factory is list
        state: Any = cells if adopted else collections.defaultdict(list, cells)
        servicer._state = state  # noqa: SLF001
        servicer._ordered_list_keys.update(ordered)  # noqa: SLF001
    return servicer


get_current_tracker = statesampler.get_current_tracker
set_current_tracker = statesampler.set_current_tracker


def record_failed_bundle_monitoring_infos(infos: list[Any]) -> None:
    """Keeps the metrics of a batch that failed, for the failing task's attempted metrics."""
    with _failed_bundle_lock:
        _failed_bundle_infos.extend(infos)


def remote_grpc_port(payload: bytes) -> beam_fn_api_pb2.RemoteGrpcPort:
    """The data-plane port of a data input or output transform (its coder id)."""
    return beam_fn_api_pb2.RemoteGrpcPort.FromString(payload)
