"""Grouping keys for elements on their way to a GroupByKey.

Spark shuffles on a ``key`` binary column. Its value is the element's key encoded with the
*runner-safe* key coder: user coders Beam does not know are length-prefixed, so the safe
coder reads them as opaque bytes and never unpickles user objects. Two keys group together
exactly when their deterministic encodings are equal, as in Beam's own FnApiRunner.
"""

from __future__ import annotations

from collections.abc import Sequence

from apache_beam.coders import Coder

from beam_spark_runner import beam_internals as bi


class KeyExtractor:
    """Computes the grouping key of each element of a windowed ``KV`` stream."""

    def __init__(self, safe_windowed_kv_coder: Coder) -> None:
        self._element_impl = safe_windowed_kv_coder.get_impl()
        kv_coder = safe_windowed_kv_coder.wrapped_value_coder  # type: ignore[attr-defined]
        self._key_impl = kv_coder.key_coder().get_impl()

    def keys(self, data: bytes, ends: Sequence[int]) -> list[bytes]:
        """One key per element of ``data``; ``ends`` are the elements' end offsets."""
        stream = bi.create_InputStream(data)
        decode = self._element_impl.decode_from_stream
        encode_key = self._key_impl.encode
        keys = []
        for _ in ends:
            windowed = decode(stream, True)
            keys.append(encode_key(windowed.value[0]))
        return keys
