"""Streaming execution: one Spark Structured Streaming query with a watermark per transform.

Spark's own event-time machinery (one watermark per query, no holds) cannot carry Beam's
semantics, so the runner carries watermarks itself, as marker rows that travel with the
elements (``../shared/design/BRIEF.md`` section 5, ``docs/architecture.md``):

* ``watermarks``  producer -> watermark bookkeeping of one stateful shard (pure Python);
* ``topology``    the plan as routed nodes: which stage or grouping runs where, who feeds
                  whom, which watermark producers each stateful node waits for (pure);
* ``source``      the query's one source (Spark's ``rate-micro-batch`` ticks, turned into the
                  roots' rows per micro-batch);
* ``test_stream`` a TestStream's events as the source's micro-batch steps;
* ``router``      stateless fused stages between stateful levels (``mapInArrow``);
* ``grouping``    GroupByKey as a ``transformWithState`` processor over Beam's trigger driver;
* ``query``       the streaming DataFrame graph, the query and its end;
* ``result``      the ``PipelineResult`` of a running query.
"""
