"""spark.internals: each accessor of PySpark's private API still finds what it names."""

from __future__ import annotations

import pickle
import sys
from typing import Any

from beam_spark_runner.spark import internals


def test_the_jvm_side_of_a_session_is_reachable(spark_session: Any) -> None:
    context = spark_session.sparkContext
    jvm = internals.context_jvm(context)
    assert jvm is not None and internals.session_jvm(spark_session) is jvm
    assert int(jvm.java.lang.Runtime.getRuntime().availableProcessors()) > 0
    assert internals.java_context(context).sc().appName() == context.appName
    assert internals.hadoop_configuration(spark_session).get("fs.defaultFS") is not None
    assert internals.java_session(spark_session).version() == spark_session.version
    frame = spark_session.range(3)
    assert internals.java_dataframe(frame).count() == 3


def test_what_a_python_function_ships_with_is_reachable(spark_session: Any) -> None:
    context = spark_session.sparkContext
    assert isinstance(internals.python_includes(context), list)
    registry = internals.pickled_broadcast_variables(context)
    assert hasattr(registry, "clear")
    variable = context.broadcast([1, 2])
    try:
        assert internals.java_broadcast(variable) is not None
    finally:
        variable.unpersist()
    assert internals.java_accumulator(context) is not None


def test_pickles_and_eval_types() -> None:
    assert pickle.loads(internals.pickle_command((len, "x"))) == (len, "x")
    assert pickle.loads(internals.pickle_by_value(lambda: 7))() == 7
    assert isinstance(internals.map_arrow_eval_type(), int)


def test_the_pre_init_modules_import() -> None:
    try:
        internals.import_pre_init_modules()
    except ImportError:
        return  # a PySpark without transformWithState: nothing to import
    assert all(module in sys.modules for module in internals.PRE_INIT_MODULES)
