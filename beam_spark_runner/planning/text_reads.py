"""Plain ``ReadFromText``s the runner reads itself (a rewrite of the proto before fusion)."""

from __future__ import annotations

import json
import logging

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning.urns import TEXT_READ_URN

_LOGGER = logging.getLogger(__name__)


def side_input_pcollections(components: bi.beam_runner_api_pb2.Components) -> set[str]:
    """The PCollections some ParDo reads as a side input."""
    return {
        transform.inputs[tag]
        for _, transform, payload in bi.par_do_payloads(components.transforms)
        for tag in payload.side_inputs
    }


def _text_files(pattern: str, compression: str) -> list[tuple[str, int]] | None:
    """The files a text read matches, as (path, size), if all are uncompressed."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        metadata = FileSystems.match([pattern])[0].metadata_list
    except Exception:  # noqa: BLE001 - Beam's own read reports it, at run time, as Beam does
        _LOGGER.debug("Could not match %s; Beam's read will", pattern, exc_info=True)
        return None
    if not metadata:
        return None  # Beam's read raises its own error for an empty match
    files = []
    for file in metadata:
        resolved = compression
        if compression == CompressionTypes.AUTO:
            resolved = CompressionTypes.detect_compression_type(file.path)
        if resolved != CompressionTypes.UNCOMPRESSED:
            return None
        files.append((file.path, file.size_in_bytes))
    return files


def native_text_reads(pipeline_proto: bi.beam_runner_api_pb2.Pipeline) -> list[str]:
    """Makes each plain ``ReadFromText`` a runner transform; returns their ids.

    Beam reads a text file through a splittable DoFn, costly per line (restriction claims,
    watermark estimation, a small read buffer). A ``Read`` of Beam's
    ``_TextSource`` with default settings (``bi.plain_text_source``), uncompressed files
    and lines not read as a side input becomes ``TEXT_READ_URN`` with the matched files as
    payload: planning gives its output a ``textread:`` buffer, the translator splits the
    files into byte ranges, and the consuming stage's worker reads the lines
    (``execution.text_read``), with Beam's exact record boundaries. Other reads keep
    Beam's expansion. Changes ``pipeline_proto`` in place.
    """
    components = pipeline_proto.components
    side_inputs = side_input_pcollections(components)
    rewritten = []
    for transform_id, transform in list(components.transforms.items()):
        source = bi.plain_text_source(transform)
        if source is None or len(transform.outputs) != 1:
            continue
        output = bi.only_element(list(transform.outputs.values()))
        pcollection = components.pcollections[output]
        windowing = components.windowing_strategies[pcollection.windowing_strategy_id]
        if (
            output in side_inputs
            or components.coders[pcollection.coder_id].spec.urn
            != bi.common_urns.coders.STRING_UTF8.urn
            or windowing.window_fn.urn != bi.common_urns.global_windows.urn
        ):
            continue
        files = _text_files(*source)
        if files is None:
            continue
        pending = list(transform.subtransforms)
        while pending:
            removed = components.transforms.pop(pending.pop())
            pending.extend(removed.subtransforms)
        del transform.subtransforms[:]
        transform.spec.CopyFrom(
            bi.beam_runner_api_pb2.FunctionSpec(
                urn=TEXT_READ_URN, payload=json.dumps(files).encode()
            )
        )
        rewritten.append(transform_id)
    if rewritten:
        _LOGGER.info("Reading %d text source(s) natively: %s", len(rewritten), rewritten)
    return rewritten
