"""The runner against the Spark and Beam lines it supports (``nox -l`` lists the sessions).

* ``tests``: the README's suite, ``pytest tests -m "not cluster and not restart"``, on the
  default versions (the newest PySpark and the newest apache-beam we support). The default
  session.
* ``smoke-<line>``: one per other line (PySpark 3.5.x and 4.0.x with the newest Beam; the
  oldest Beam we support with the newest PySpark): the unit tests but the end-to-end runs
  marked ``slow``, the pipeline tests that exercise GroupByKey, side inputs, text IO and
  metrics, and a slice of Beam's FnApiRunner suite (``validates_runner``). Every line
  streams (PySpark 3.5 on ``applyInPandasWithState``), so the unit tests include the
  streaming tests not marked ``slow`` that the line runs: the line's streaming slice. Tagged
  ``smoke``: ``nox -t smoke`` runs them all, and so does ``ci/matrix.sh`` (after ``make
  test`` in CI).
* ``nox -s smoke-<line> -- full``: the full suite (``tests -m "not cluster and not
  restart"``) in that line's venv, for when a smoke session fails. Other arguments after
  ``--`` go to pytest.
* ``streaming-<line>``: on the lines that stream but are not the default (PySpark 3.5, 4.0),
  the streaming checks the default line runs outside ``make test``: Beam's streaming test
  modules on the runner (``validates_runner.teststream``, ``make teststream-check``), every
  test of ``tests/streaming/`` and of ``tests/*/test_*stream*.py`` (those marked ``slow``
  and the standalone cluster's too) and the restart tests
  (``-m restart``). Not tagged ``smoke``: CI's matrix does not run it (over an hour on 2
  cores); ``make teststream-check-matrix`` does. ``-- teststream``, ``-- streaming`` or
  ``-- restart`` runs only those parts.

Every session installs this checkout (editable, without its dependencies) beside the
dependencies of ``pyproject.toml``, with apache-beam and pyspark pinned to the line's
versions. Virtualenvs are made with uv where it is installed (else virtualenv and pip),
kept under ``.nox/`` and reused; a session installs again only when its requirements or
``pyproject.toml`` change (``nox --reuse-venv=never`` rebuilds them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
import time
from pathlib import Path

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - nox runs on the dev venv's Python (3.11)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"
# uv installs a line in about a minute from an empty cache (pip: several, mostly building
# PySpark's wheel); without uv, virtualenv and pip.
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_external_run = True

# The newest releases we support: the default line, which `make test` also runs.
NEWEST_BEAM = "2.77.0"
NEWEST_SPARK = "4.3.0"


@dataclasses.dataclass(frozen=True)
class Line:
    """One cell of the matrix: the versions a session pins."""

    name: str
    spark: str
    beam: str
    # Extra requirements for this line (e.g. what an older PySpark needs of pandas).
    extra: tuple[str, ...] = ()


DEFAULT = Line("default", spark=NEWEST_SPARK, beam=NEWEST_BEAM)
OTHER_LINES = (
    # Spark 3.5 runs on Java 8+ (4.x needs 17). PySpark 3.5's "sql" extra asks numpy < 2;
    # the runner does not install that extra, and passes with the numpy 2 pip resolves.
    Line("spark3.5", spark="3.5.9", beam=NEWEST_BEAM),
    Line("spark4.0", spark="4.0.5", beam=NEWEST_BEAM),
    # The oldest apache-beam we support. Its internals that the runner uses (beam_internals.py)
    # exist from 2.65 (pipeline_utils), but Beam <= 2.67 caps pyarrow < 17 and PySpark 4.3
    # needs pyarrow >= 18, and Beam 2.68 caps protobuf < 6 where PySpark 4.3's state protocol
    # (transformWithState, so streaming) needs protobuf >= 6.33.5: 2.69 is the oldest Beam
    # with which every feature works on every line.
    Line("beam2.69", spark=NEWEST_SPARK, beam="2.69.0"),
)
STREAMING_LINES = tuple(line for line in OTHER_LINES if line.name in ("spark3.5", "spark4.0"))

# The smoke subset of the pipeline tests: GroupByKey (windows, merging, triggers), side
# inputs, text IO, metrics, combiners, Flatten, Reshuffle, and a failing DoFn's message.
SMOKE_PIPELINE_TESTS = (
    "group_by_key or merging_window or triggered or side_input or text_read or metrics"
    " or combiners or flatten or reshuffle or failing_dofn or map_flatmap_filter"
)
# Everything but the pipeline tests, the cluster tests, the CLI's demo run on Spark and the
# end-to-end runs marked slow (most 8 s or more; `make test` runs them on the default line).
# Of those paths the sessions keep one case each: streaming panes against DirectRunner
# (late data and a CoGroupByKey), the main session with dill, the native combine on. With
# them the three sessions took 2 700+ s on CI's machine, beside `make test`'s 1 850 s of
# CI's 5 400.
UNIT_TEST_ARGS = (
    "tests",
    "-m",
    "not cluster and not restart and not slow",
    "--ignore=tests/test_pipelines.py",
    "--ignore=tests/cluster",
    "-k",
    "not demo_on_spark",
)
# A slice of Beam's FnApiRunnerTest on SparkStructuredRunner.
VALIDATES_RUNNER_SLICE = "test_pardo or test_group_by_key or test_flatten"
# Test-extra entries the sessions do not need: lint, type checks and the matrix's own tools.
TOOLS = frozenset({"ruff", "mypy", "nox", "uv"})


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower()


def requirements(line: Line) -> list[str]:
    """pyproject.toml's dependencies and test extra, Beam and PySpark pinned to ``line``."""
    project = _pyproject()["project"]
    pins = {"apache-beam": f"apache-beam=={line.beam}", "pyspark": f"pyspark=={line.spark}"}
    extra_names = {_name(r) for r in line.extra}
    result = []
    for requirement in project["dependencies"]:
        name = _name(requirement)
        if name in extra_names:
            continue
        result.append(pins.pop(name, requirement))
    result += pins.values()
    extras = project.get("optional-dependencies", {})
    for requirement in _expanded(extras, "test"):
        # pytest and what Beam's test modules import (validates_runner/); not the tools.
        if _name(requirement) not in TOOLS:
            result.append(_pinned(requirement, line))
    return result + list(line.extra)


def _expanded(extras: dict[str, list[str]], extra: str) -> list[str]:
    """An extra's requirements, this project's own extras expanded.

    ``beam-spark-runner[x]`` becomes extra x's requirements: the session installs this
    checkout, not a released package.
    """
    result = []
    for requirement in extras.get(extra, []):
        if _name(requirement) == "beam-spark-runner":
            inner = re.search(r"\[(.*?)\]", requirement)
            for name in inner.group(1).split(",") if inner else []:
                result += _expanded(extras, name.strip())
        else:
            result.append(requirement)
    return result


def _pinned(requirement: str, line: Line) -> str:
    """Beam with extras (``apache-beam[yaml]``) at the line's Beam version."""
    if _name(requirement) == "apache-beam":
        extras = re.search(r"\[.*?\]", requirement)
        return f"apache-beam{extras.group(0) if extras else ''}=={line.beam}"
    return requirement


def install(session: nox.Session, line: Line) -> None:
    """Installs the line's requirements and this checkout, unless already installed."""
    reqs = requirements(line)
    # Of the requirements and pyproject.toml's contents, not its path: the same in any clone.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    digest = hashlib.sha256("\n".join([*reqs, pyproject]).encode()).hexdigest()
    stamp = Path(session.virtualenv.location) / ".beam-spark-runner-installed"
    installed = stamp.read_text().splitlines() if stamp.exists() else []
    started = time.monotonic()
    if installed[:1] == [digest]:
        session.log(f"Requirements unchanged since the last install: {' '.join(reqs)}")
    else:
        if session.venv_backend != "uv":
            session.install("--upgrade", "pip")
        session.install(*reqs)
        installed = []
    if installed[1:2] != [str(ROOT)]:
        # Editable, so the tests import this checkout; --no-deps keeps the pins above even
        # where pyproject's own range would exclude them. Again when the venv is reused
        # from another checkout (ci/matrix.sh keeps CI's venvs outside the clone).
        session.install("--no-deps", "-e", str(ROOT))
    stamp.write_text(f"{digest}\n{ROOT}\n")
    session.log(f"Install step: {time.monotonic() - started:.0f} s")


def report_versions(session: nox.Session) -> None:
    """Prints what the session runs on (and fails if the pins did not take)."""
    session.run("python", "-m", "beam_spark_runner", "--version")


def pytest(session: nox.Session, *args: str) -> None:
    """Runs pytest in the session (with the session's pytest arguments), timing it."""
    timed_pytest(session, *args, *pytest_args(session))


def timed_pytest(session: nox.Session, *args: str) -> None:
    """Runs pytest with exactly ``args``, timing it."""
    started = time.monotonic()
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *args)
    session.log(f"pytest {' '.join(args)}: {time.monotonic() - started:.0f} s")


def wants_full_suite(session: nox.Session) -> bool:
    """``nox -s smoke-<line> -- full``: the full suite, in the smoke session's venv."""
    return session.posargs[:1] == ["full"]


def pytest_args(session: nox.Session) -> list[str]:
    """The arguments after ``--`` (less a leading ``full``), passed on to pytest."""
    return session.posargs[1:] if wants_full_suite(session) else session.posargs


def full_suite(session: nox.Session, line: Line) -> None:
    install(session, line)
    report_versions(session)
    pytest(session, "tests", "-m", "not cluster and not restart")


def smoke(session: nox.Session, line: Line) -> None:
    install(session, line)
    report_versions(session)
    pytest(session, *UNIT_TEST_ARGS)
    pytest(session, "tests/test_pipelines.py", "-k", SMOKE_PIPELINE_TESTS)
    started = time.monotonic()
    # Logs and junitxml, overwritten by the next run: <session venv>/tmp/validates_runner-<line>.
    out_dir = Path(session.create_tmp()) / f"validates_runner-{line.name}"
    session.run(
        "python",
        "-m",
        "validates_runner.report",
        "--suite",
        "fnapi",
        "-k",
        VALIDATES_RUNNER_SLICE,
        "--out-dir",
        str(out_dir),
    )
    session.log(f"validates_runner slice: {time.monotonic() - started:.0f} s")


def _environment(session: nox.Session, line: Line) -> None:
    # Spark's Python workers must use the session's interpreter. The runner sets this only
    # when it is unset; one inherited from the caller would point at another venv.
    python = str(Path(session.bin) / "python")
    session.env["PYSPARK_PYTHON"] = python
    session.env["PYSPARK_DRIVER_PYTHON"] = python
    # tests/spark/test_versions.py checks that the session really runs on these.
    session.env["BEAM_SPARK_RUNNER_EXPECT_PYSPARK"] = line.spark
    session.env["BEAM_SPARK_RUNNER_EXPECT_BEAM"] = line.beam


@nox.session(name="tests")
def tests(session: nox.Session) -> None:
    """The full suite (``tests -m "not cluster and not restart"``), newest PySpark and Beam."""
    _environment(session, DEFAULT)
    full_suite(session, DEFAULT)


# The parts of a streaming session, in the order they run.
STREAMING_PARTS = ("teststream", "streaming", "restart")


def streaming_parts(session: nox.Session) -> list[str]:
    """The parts named after ``--`` (all of them when none is)."""
    unknown = [part for part in session.posargs if part not in STREAMING_PARTS]
    if unknown:
        session.error(
            f"Unknown part(s) {' '.join(unknown)}: expected any of {' '.join(STREAMING_PARTS)} "
            "(none runs them all)."
        )
    return [part for part in STREAMING_PARTS if part in session.posargs] or list(STREAMING_PARTS)


def streaming_test_paths() -> list[str]:
    """tests/streaming/ and the streaming test modules elsewhere (planning, run, io, cluster)."""
    elsewhere = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").glob("*/test_*stream*.py")
        if path.parent.name != "streaming"
    )
    return ["tests/streaming", *elsewhere]


def streaming_checks(session: nox.Session, line: Line) -> None:
    """Beam's streaming test modules, tests/streaming/ and the restart tests on ``line``."""
    install(session, line)
    report_versions(session)
    parts = streaming_parts(session)
    if "teststream" in parts:
        started = time.monotonic()
        # Logs and junitxml, overwritten by the next run: <session venv>/tmp/teststream-<line>.
        out_dir = Path(session.create_tmp()) / f"teststream-{line.name}"
        session.run("python", "-m", "validates_runner.teststream", "--out-dir", str(out_dir))
        session.log(f"teststream check: {time.monotonic() - started:.0f} s")
    if "streaming" in parts:
        timed_pytest(session, *streaming_test_paths(), "-m", "not restart")
    if "restart" in parts:
        timed_pytest(session, "tests", "-m", "restart")


def _register(line: Line) -> None:
    def smoke_session(session: nox.Session) -> None:
        _environment(session, line)
        if wants_full_suite(session):
            full_suite(session, line)
        else:
            smoke(session, line)

    smoke_session.__doc__ = (
        f"PySpark {line.spark}, apache-beam {line.beam}: unit tests, GroupByKey/side "
        "input/text IO/metrics pipelines, a validates_runner slice (`-- full`: all tests)."
    )
    nox.session(name=f"smoke-{line.name}", tags=["smoke"])(smoke_session)


def _register_streaming(line: Line) -> None:
    def streaming_session(session: nox.Session) -> None:
        _environment(session, line)
        streaming_checks(session, line)

    streaming_session.__doc__ = (
        f"PySpark {line.spark}, apache-beam {line.beam}: Beam's streaming test modules, "
        "tests/streaming/ and the restart tests (`-- teststream|streaming|restart`: those)."
    )
    nox.session(name=f"streaming-{line.name}")(streaming_session)


for _line in OTHER_LINES:
    _register(_line)
# The non-default lines that stream (PySpark 4.0 and newer).
for _line in STREAMING_LINES:
    _register_streaming(_line)
