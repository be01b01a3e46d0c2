"""Runs Apache Beam's own runner test suites against SparkStructuredRunner.

See ``validates_runner/README.md``.
"""
