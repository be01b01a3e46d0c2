"""The PySpark adapter: the session, the JVM, and every use of PySpark's private API.

What the runner changes in PySpark's and Py4J's behaviour, where and for how long:

* ``worker_daemon`` (the runner's Python worker daemon, in the daemon's own process, for
  its life): PySpark's forked worker quits quietly when the JVM has closed its socket.
* ``driver_jvm.forget`` (the driver, once): after the driver JVM has exited, PySpark's
  class-level handles on it (gateway, context, sessions) are dropped so that the next
  session launches a new JVM.
* ``streaming.sink_watch.quiet_callback_errors`` (the driver, while a streaming run's query
  runs): Py4J's callback loggers log the ERROR record of the runner's own callback errors
  at DEBUG (``QueryInterrupted``, a query stopped mid-batch; ``MicroBatchFailed``, whose
  error the run raises); every other record passes.
* Sessions the runner creates carry its settings (``session``). On any session, a run's
  SQL settings hold only while it plans and starts (``session.settings_within``), except
  the RocksDB state store provider a streaming run sets for good
  (``streaming.query.ensure_state_store``: ``transformWithState`` needs it).
"""
