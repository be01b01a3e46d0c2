"""Beam's metrics containers, step states and monitoring infos, as its operations report."""

from __future__ import annotations

from typing import Any

from apache_beam.metrics import monitoring_infos
from apache_beam.runners import common as runners_common
from apache_beam.runners.portability import portable_metrics
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.runners.worker import (
    statesampler,
)

from_monitoring_infos = portable_metrics.from_monitoring_infos
# FnApiRunner reports its number of fused stages as this pipeline-level counter.
NUM_FUSED_STAGES_URN: str = "internal:" + FnApiRunner.NUM_FUSED_STAGES_COUNTER


def metrics_container(step_name: str) -> Any:
    """A fresh metrics container for one step (Beam's ``MetricsContainer``)."""
    from apache_beam.metrics.execution import MetricsContainer

    return MetricsContainer(step_name)


def state_sampler(name: str) -> Any:
    """A state sampler that is never started: it only tells user code its step's metrics."""
    from apache_beam.utils.counters import CounterFactory

    return statesampler.StateSampler(name, CounterFactory())


def scoped_state(
    sampler: Any, step_name: str, transform_id: str, state_name: str, container: Any
) -> Any:
    """The sampler state of one step's ``state_name`` (start, process, finish)."""
    return sampler.scoped_state(
        runners_common.NameContext(step_name, transform_id),
        state_name,
        metrics_container=container,
    )


def user_monitoring_infos(container: Any, transform_id: str) -> list[Any]:
    """A step's user metrics as monitoring infos, as Beam's operations report them."""
    return list(container.to_runner_api_monitoring_infos(transform_id).values())


def pcollection_monitoring_infos(
    pcollection_id: str, count: int, sizes: tuple[int, int, int, int]
) -> list[Any]:
    """Element count and sampled byte size (sum, count, min, max) of one PCollection."""
    from apache_beam.metrics.cells import DistributionData

    return [
        monitoring_infos.int64_counter(
            monitoring_infos.ELEMENT_COUNT_URN, count, pcollection=pcollection_id
        ),
        monitoring_infos.int64_distribution(
            monitoring_infos.SAMPLED_BYTE_SIZE_URN,
            DistributionData(*sizes),
            pcollection=pcollection_id,
        ),
    ]


def execution_time_monitoring_infos(
    transform_id: str, start_ms: int, process_ms: int, finish_ms: int
) -> list[Any]:
    """A step's start, process, finish and total milliseconds, as Beam's operations report."""
    return [
        monitoring_infos.int64_counter(urn, value, ptransform=transform_id)
        for urn, value in (
            (monitoring_infos.START_BUNDLE_MSECS_URN, start_ms),
            (monitoring_infos.PROCESS_BUNDLE_MSECS_URN, process_ms),
            (monitoring_infos.FINISH_BUNDLE_MSECS_URN, finish_ms),
            (monitoring_infos.TOTAL_MSECS_URN, start_ms + process_ms + finish_ms),
        )
    ]


def read_index_monitoring_info(transform_id: str, index: int) -> Any:
    """The data input's read index (elements read), as its operation reports it."""
    return monitoring_infos.int64_counter(
        monitoring_infos.DATA_CHANNEL_READ_INDEX, index, ptransform=transform_id
    )


def is_read_index_info(info: Any, transform_id: str) -> bool:
    """Whether ``info`` is the read index of the data input ``transform_id``."""
    return bool(
        info.urn == monitoring_infos.DATA_CHANNEL_READ_INDEX
        and info.labels.get(monitoring_infos.PTRANSFORM_LABEL) == transform_id
    )
