"""Benchmarks: SparkStructuredRunner next to DirectRunner, hand-written PySpark and Spark SQL.

``python -m benchmarks.run`` (``make bench``) runs every workload on every runner, each pair
in its own subprocess, and writes ``benchmarks/results/latest.{md,png,json}``. See
``docs/performance.md`` for the method and the latest figures.
"""
