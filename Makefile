# beam-spark-runner: the targets a newcomer would guess.
# Everything runs in a project virtualenv (.venv) that `make install` creates.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST := $(PY) -m pytest -p no:cacheprovider

.PHONY: install jar demo quick test unit-test cluster-test restart-test validates-runner teststream-check teststream-check-matrix dataframe-check matrix lint typecheck bench bench-nexmark bench-streaming clean help

help:
	@echo "make demo              run the demo pipeline on an embedded local[*] Spark"
	@echo "make test              lint, type-check, unit + pipeline tests, cluster smoke, validates-runner"
	@echo "make quick             the tests that start no Spark (about a minute): the inner loop"
	@echo "make unit-test         unit and pipeline tests only (local[2])"
	@echo "make cluster-test      smoke tests on a standalone Spark cluster (separate executors)"
	@echo "make restart-test      streaming drivers killed and restarted from checkpoints (long)"
	@echo "make validates-runner  Beam's own runner suites against SparkStructuredRunner, as a table"
	@echo "make capabilities      regenerate docs/capabilities.md from the last validates-runner run"
	@echo "make teststream-check  Beam's streaming test modules on this runner, in streaming (long)"
	@echo "make teststream-check-matrix  the same, all of tests/streaming/ and the restart tests on"
	@echo "                       another line's venv (LINE=spark4.0 or spark3.5; PARTS=teststream|streaming|restart; 2-3 h)"
	@echo "make dataframe-check   Beam's DataFrame API tests on this runner next to DirectRunner (~5-7 min)"
	@echo "make matrix            smoke tests on the other Spark/Beam lines (nox; see noxfile.py)"
	@echo "make bench-streaming   streaming Nexmark: ours, PySpark Structured Streaming (and a Python-per-event floor), DirectRunner; then state with 1 000 and 2 000 000 keys (~2 h)"
	@echo "make lint typecheck    ruff and mypy"
	@echo "make jar               rebuild beam_spark_runner/spark/jars/ from jvm/src (needs a JDK)"
	@echo "make bench             benchmarks (see benchmarks/)"
	@echo "make bench-nexmark     the windowed Nexmark queries, one round (~40 min)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	@# Bytecode for the package, as a wheel's install writes it: an editable install's modules
	@# are otherwise compiled from source in every process (the driver, the worker daemon,
	@# a streaming query's pre-init server) where PYTHONDONTWRITEBYTECODE is set. Python
	@# still checks each file's timestamp: an edited module is compiled from its source.
	$(PY) -m compileall -q beam_spark_runner
	@touch $(STAMP)

install: $(STAMP)

# The runner's few JVM classes (jvm/src), built for Java 8 and up against the Hadoop that
# PySpark ships, into a jar the package carries (committed: users need no JDK's compiler).
# Reproducible: fixed entry times, so the same sources give the same bytes.
JAR := beam_spark_runner/spark/jars/beam-spark-runner-jvm.jar
HADOOP_API = $$($(PY) -c 'import pyspark, pathlib; print(next((pathlib.Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")))')
jar: $(STAMP)
	rm -rf build/jvm && mkdir -p build/jvm $(dir $(JAR))
	hadoop="$(HADOOP_API)" && \
	javac -Xlint:all -Xlint:-options -Werror --release 8 -d build/jvm/classes -cp "$$hadoop" \
		$$(find jvm/src -name '*.java' | sort) && \
	echo "Built-Against: $$(basename "$$hadoop" .jar)" > build/jvm/MANIFEST.MF
	jar --create --date=2026-01-01T00:00:00Z --file $(JAR) --manifest build/jvm/MANIFEST.MF \
		-C build/jvm/classes .

demo: $(STAMP)
	$(PY) -m beam_spark_runner demo --output demo-output/wordcount

lint: $(STAMP)
	$(PY) -m ruff check beam_spark_runner benchmarks tests validates_runner scripts noxfile.py
	$(PY) -m ruff format --check beam_spark_runner benchmarks tests validates_runner scripts noxfile.py

typecheck: $(STAMP)
	$(PY) -m mypy

# The fast tier: every test that starts no Spark. A test that starts a JVM here fails,
# saying to mark it `spark` (tests/conftest.py).
quick: $(STAMP)
	BEAM_SPARK_QUICK_TESTS=1 $(PYTEST) tests -q -m "not spark and not cluster and not restart"

unit-test: $(STAMP)
	$(PYTEST) tests -m "not cluster and not restart"

cluster-test: $(STAMP)
	$(PYTEST) tests -m "cluster and not restart"

# Streaming drivers SIGKILLed mid-batch, during a sink's commit and after a commit, then
# restarted from their checkpoint: the output must be exactly an uninterrupted run's, on
# local[2] and on a standalone cluster. Several minutes: not part of `make test`.
restart-test: $(STAMP)
	$(PYTEST) tests -m restart

validates-runner: $(STAMP)
	$(PY) -m validates_runner.report

# Beam's test modules using TestStream or PeriodicImpulse (test_stream, trigger, deduplicate,
# periodicsequence, userstate, sideinputs, combiners, window, io.fileio, runners.common,
# util)
# with every pipeline on this runner: each test passes, is refused before Spark starts, or
# is a listed case that is not the runner's. Each streaming test is a query (a micro-batch
# per TestStream event), so this is long: not part of `make test`.
teststream-check: $(STAMP)
	$(PY) -m validates_runner.teststream

# teststream-check, every test of tests/streaming/ (slow ones too) and the restart tests on
# another streaming line (nox session streaming-$(LINE), in that line's venv under
# $(NOX_ENVDIR)). PARTS picks some of teststream, streaming, restart (default: all). Run it
# before changing what a line streams; CI's matrix runs only each line's streaming slice.
LINE ?= spark4.0
PARTS ?=
NOX_ENVDIR ?= .nox
teststream-check-matrix: $(STAMP)
	$(PY) -c "import nox, uv" 2>/dev/null || $(PY) -m pip install --quiet "nox>=2024.4.15" "uv>=0.4"
	$(PY) -m nox --no-color --envdir $(NOX_ENVDIR) -s streaming-$(LINE) -- $(PARTS)

# Beam's DataFrame API tests (transforms_test, io_test) on DirectRunner and with every
# pipeline forced onto this runner: a test passing on DirectRunner must pass here too.
dataframe-check: $(STAMP)
	$(PY) -m validates_runner.dataframe

# validates-runner regenerates docs/capabilities.md after a complete run; this target redoes
# only that, from the results it saved in build/validates-runner/results.json.
.PHONY: capabilities
capabilities: $(STAMP)
	$(PY) -m validates_runner.capabilities_doc

matrix: $(STAMP)
	VENV=$(VENV) bash ci/matrix.sh

test: lint typecheck unit-test cluster-test validates-runner dataframe-check

bench: $(STAMP)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks.run

bench-nexmark: $(STAMP)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks.run --runs 1 --output-dir benchmarks/results/nexmark --workloads \
		$$($(PY) -c "from benchmarks.workloads import WINDOWED_NEXMARK_WORKLOADS as w; print(','.join(w))")

# Streaming Nexmark q0, q1, q2, q5, q7, q8, q11 on local[2]: ours against hand-written PySpark
# Structured Streaming and DirectRunner in streaming, the highest event rate each keeps up
# with searched on a ladder of rates (see benchmarks/streaming.py). About an hour.
bench-streaming: $(STAMP)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks.streaming --state-keys 1000,2000000

clean:
	rm -rf build dist *.egg-info demo-output .mypy_cache .ruff_cache spark-warehouse .nox
