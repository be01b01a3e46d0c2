"""Keeps PySpark's data-source lookup worker quiet; it registers no data source.

At a session's first Python data source (a ``ReadFromSparkStream`` over one, say) PySpark
looks for statically installed ones: a worker forked from its own daemon on the driver
(``pyspark.sql.worker.lookup_data_sources``) imports every top-level module whose name
starts with ``pyspark_`` and registers its ``DefaultSource``, if it has one. This module
has none. Imported there, it wraps that worker
(``beam_spark_runner.streaming.driver_processes.quiet_daemon_child``), so that it ends
without a ``BrokenPipeError`` traceback on the driver's console when the JVM closes its
socket: a minute into every streaming pipeline, or when the session stops. Imported
anywhere else it does nothing.
"""

from beam_spark_runner.streaming.driver_processes import quiet_daemon_child

quiet_daemon_child()
