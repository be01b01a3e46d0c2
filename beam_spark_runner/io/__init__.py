"""Beam transforms that only SparkStructuredRunner runs.

* ``ReadFromSparkStream``  any Spark streaming source (files, ``rate``, Kafka with its
                           connector) as an unbounded PCollection of schema'd rows.
"""

from beam_spark_runner.io.spark_stream import ReadFromSparkStream

__all__ = ["ReadFromSparkStream"]
