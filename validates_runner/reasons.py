"""Why Beam tests are skipped on SparkStructuredRunner: one reason per missing capability.

Every skip in this harness uses one of these strings, so the report can group skipped tests
by capability and tell them apart from skips Beam's tests make themselves. Each test was run
and seen to fail for the reason given before it was skipped here.
"""

from __future__ import annotations

RUNNER_SPLITS = (
    "Runner-initiated splits are not supported yet: the tests drive FnApiRunner's split hooks "
    "(fn_runner.split_manager, DirectOptions.direct_test_splits) and an ElementCounter shared "
    "in-process with the SDK harness"
)
PUBSUB_STREAMING = (
    "A Dataflow streaming test reading Pub/Sub, an unbounded source that never ends: it "
    "needs google-cloud-pubsub and a GCP project, which this harness has not"
)

STREAMING_SPARK_NEEDED = (
    "Streaming needs a newer PySpark (spark.compat.STREAMING_SPARK): the test's pipeline "
    "reads an unbounded source (PeriodicImpulse, an UnboundedSource), which no batch run is "
    "proven to give the streaming result of, so this PySpark refuses it before Spark starts"
)


HARNESS_REASONS: frozenset[str] = frozenset(
    [
        RUNNER_SPLITS,
        PUBSUB_STREAMING,
        STREAMING_SPARK_NEEDED,
    ]
)
