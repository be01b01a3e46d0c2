"""Bridges between Beam's coders and Arrow columns.

A PCollection travels through Spark as Arrow record batches whose ``element`` column holds
Beam-encoded windowed values (value, timestamp, windows, pane), encoded with the
PCollection's data-channel coder in the nested context. One cell may hold several
concatenated elements ("packed"), because a data-channel stream is just their
concatenation. ``key`` holds the deterministic encoding of an element's key where the next
step groups by key.
"""

from beam_spark_runner.coders.arrow_columns import (
    decode_column,
    encode_column,
    packed_bytes,
    split_packed,
)
from beam_spark_runner.coders.keys import KeyExtractor

__all__ = ["KeyExtractor", "decode_column", "encode_column", "packed_bytes", "split_packed"]
