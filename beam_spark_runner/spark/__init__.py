"""The PySpark adapter: the session, the JVM, and every use of PySpark's private API.

What the runner changes in PySpark's and Py4J's behaviour, where and for how long:

* ``worker_daemon`` (the runner's Python worker daemon, in the daemon's own process, for
  its life): PySpark's forked worker quits quietly when the JVM has closed its socket.
* ``driver_jvm.forget`` (the driver, once): after the driver JVM has exited, PySpark's
  class-level handles on it (gateway, context, sessions) are dropped so that the next
  session launches a new JVM.
* ``streaming.sink_watch.quiet_interruptions`` (the driver, for the process's life, once
  a query has run): Py4J's callback logger drops the ERROR record of the runner's own
  ``QueryInterrupted`` (a query stopped mid-batch); every other record passes.
* Sessions the runner creates carry its settings (``session``). On any session, a run's
  SQL settings hold only while it plans and starts (``session.settings_within``), except
  the RocksDB state store provider a streaming run sets for good
  (``streaming.query.ensure_state_store``: ``transformWithState`` needs it).
"""
