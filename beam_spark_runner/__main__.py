"""Command line: ``python -m beam_spark_runner --version`` and ``... demo``.

``--version`` prints what a bug report needs: the versions of this runner, apache-beam,
PySpark, Java and Python. ``demo`` runs a word count on SparkStructuredRunner (see
:mod:`beam_spark_runner.demo`).
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from beam_spark_runner._version import __version__

_LOGGER = logging.getLogger("beam_spark_runner")


def _distribution_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _java_description() -> str:
    from beam_spark_runner.spark.java import java_executable, java_version

    java = java_executable()
    if java is None:
        return "not found (set JAVA_HOME or put `java` on PATH)"
    return f"{java_version(java) or 'unknown version'} ({java})"


def version_report() -> str:
    """One line per component: this runner, apache-beam, pyspark, Java, Python."""
    rows = [
        ("beam-spark-runner", __version__),
        ("apache-beam", _distribution_version("apache-beam")),
        ("pyspark", _distribution_version("pyspark")),
        ("java", _java_description()),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("platform", platform.platform()),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


class _VersionAction(argparse.Action):
    """``--version``: print the report and exit, like argparse's own version action."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_report())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m beam_spark_runner``."""
    parser = argparse.ArgumentParser(
        prog="python -m beam_spark_runner",
        description="SparkStructuredRunner: run Apache Beam Python pipelines on Apache Spark.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the versions of this runner, apache-beam, pyspark, Java and Python, and exit",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        allow_abbrev=False,
        usage="%(prog)s [-h] [--output DIR] [PIPELINE_OPTION ...]",
        help="run a word count on SparkStructuredRunner",
        description=(
            "Counts the words of a generated text on SparkStructuredRunner (an embedded "
            "local[*] Spark unless --spark_master says otherwise) and prints where the "
            "counts were written. Arguments not listed here are passed to Beam as pipeline "
            "options, e.g. --spark_master=local[2], --spark_conf KEY=VALUE, "
            "--runner=DirectRunner."
        ),
    )
    demo.add_argument(
        "--output",
        metavar="DIR",
        default=None,
        help="directory for the output shards (default: a new temporary directory)",
    )
    return parser


def _run_demo(output: str | None, pipeline_args: list[str]) -> int:
    from beam_spark_runner import demo

    # The runner's own progress at INFO; Beam's and Spark's only from WARNING up.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _LOGGER.setLevel(logging.INFO)
    output_dir = demo.run(output, pipeline_args)
    print(f"output written to {demo.output_pattern(output_dir)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m beam_spark_runner``; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "demo":
        return _run_demo(args.output, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
