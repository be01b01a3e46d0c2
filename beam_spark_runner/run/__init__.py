"""A pipeline's run on Spark, the same in batch and streaming: prepared, opened, closed.

``prepare`` decides everything that needs no Spark (globals, checks, the plan);
``lifecycle.OpenRun`` opens the run on a session (collectors, accumulators, main session)
and closes it once (worker logs, warnings, metrics, the failure's description); ``batch``
runs the plan as one Spark job and ``streaming`` as one streaming query.
"""
