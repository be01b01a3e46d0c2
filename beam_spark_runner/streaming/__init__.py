"""Streaming execution: one Spark Structured Streaming query with a watermark per transform.

Spark's own event-time machinery (one watermark per query, no holds) cannot carry Beam's
semantics, so the runner carries watermarks itself, as marker rows that travel with the
elements (``docs/streaming.md``). Start with ``query`` (the streaming
DataFrame graph), ``topology`` (the plan as routed nodes), ``source`` (the query's one
source) and ``watermarks`` (one stateful shard's watermark bookkeeping, pure Python).
"""
