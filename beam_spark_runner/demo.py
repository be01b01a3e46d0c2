"""A word count to try the runner with: ``python -m beam_spark_runner demo``.

The demo writes a small generated corpus to a temporary directory, counts its words with
``ReadFromText`` -> ``FlatMap`` -> ``CombinePerKey(sum)`` -> ``WriteToText`` and reports
where the counts are. The corpus is the same on every run, so the counts can be compared
with the same pipeline run on Beam's DirectRunner (:func:`run_on_direct_runner`), which is
what the tests do.

The corpus lives on the driver's local disk, so the demo suits local masters
(``local[*]``, ``local-cluster[...]``); a remote cluster's executors cannot read it.
"""

from __future__ import annotations

import logging
import random
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_LOGGER = logging.getLogger(__name__)

DEFAULT_RUNNER = "SparkStructuredRunner"
REFERENCE_RUNNER = "BundleBasedDirectRunner"
CORPUS_LINES = 300
OUTPUT_PREFIX = "counts"
_SEED = 20240917
_WORDS = (
    "apache beam spark runner pipeline stage bundle window trigger watermark element key "
    "value shuffle partition executor driver arrow column coder state timer combine group "
    "flatten impulse read write count word the a of and to in on with"
).split()


def write_corpus(directory: str | Path, lines: int = CORPUS_LINES) -> Path:
    """Writes ``lines`` lines of generated text to ``directory/corpus.txt``.

    The words come from a fixed vocabulary and a seeded generator, so every call writes
    the same file.
    """
    generator = random.Random(_SEED)
    path = Path(directory) / "corpus.txt"
    with path.open("w", encoding="utf-8") as corpus:
        for _ in range(lines):
            words = generator.choices(_WORDS, k=generator.randint(3, 12))
            corpus.write(" ".join(words) + "\n")
    return path


def split_words(line: str) -> list[str]:
    """The words of one line, lower-cased."""
    return re.findall(r"[a-z']+", line.lower())


def format_count(word_count: tuple[str, int]) -> str:
    """One output line, ``word: count``."""
    word, count = word_count
    return f"{word}: {count}"


def word_count(pipeline: Any, input_pattern: str, output_prefix: str) -> None:
    """Adds the word count transforms to ``pipeline``."""
    import apache_beam as beam

    _ = (
        pipeline
        | "Read" >> beam.io.ReadFromText(input_pattern)
        | "Split" >> beam.FlatMap(split_words)
        | "PairWithOne" >> beam.Map(lambda word: (word, 1))
        | "Count" >> beam.CombinePerKey(sum)
        | "Format" >> beam.Map(format_count)
        | "Write" >> beam.io.WriteToText(output_prefix, file_name_suffix=".txt")
    )


def _pipeline_options(pipeline_args: Sequence[str], default_runner: str) -> Any:
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    # Beam parses only the options of PipelineOptions subclasses already imported; without
    # this import it would warn that it discards --spark_master and the like.
    from beam_spark_runner.options import SparkRunnerOptions

    options = PipelineOptions(list(pipeline_args))
    options.view_as(SparkRunnerOptions)
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = default_runner
    return options


def run(
    output_dir: str | Path | None = None,
    pipeline_args: Sequence[str] = (),
    default_runner: str = DEFAULT_RUNNER,
) -> Path:
    """Runs the word count and returns the directory holding its output shards.

    ``output_dir`` defaults to a new temporary directory, which is kept so that the
    output can be read afterwards. ``pipeline_args`` are Beam pipeline options, e.g.
    ``["--spark_master=local[2]"]``; ``--runner`` among them overrides ``default_runner``.
    """
    import apache_beam as beam

    output = (
        Path(output_dir) if output_dir is not None else Path(tempfile.mkdtemp(prefix="bsr-demo-"))
    )
    output.mkdir(parents=True, exist_ok=True)
    options = _pipeline_options(pipeline_args, default_runner)
    with tempfile.TemporaryDirectory(prefix="bsr-demo-input-") as input_dir:
        corpus = write_corpus(input_dir)
        _LOGGER.info(
            "Counting the words of %s (%d lines) on %s",
            corpus,
            CORPUS_LINES,
            options.get_all_options()["runner"],
        )
        with beam.Pipeline(options=options) as pipeline:
            word_count(pipeline, str(corpus), str(output / OUTPUT_PREFIX))
    _LOGGER.info("Word counts written to %s", output_pattern(output))
    return output


def run_on_direct_runner(output_dir: str | Path, pipeline_args: Sequence[str] = ()) -> Path:
    """Runs the same word count on Beam's DirectRunner, as a reference.

    It uses the DirectRunner's own engine (``BundleBasedDirectRunner``): the plain
    ``DirectRunner`` name first tries Prism, which downloads a binary, and then Beam's
    FnApiRunner, whose fusion and bundle processing this runner reuses and so would not
    make an independent reference.
    """
    return run(output_dir, [*pipeline_args, f"--runner={REFERENCE_RUNNER}"])


def output_pattern(output_dir: str | Path) -> str:
    """The glob pattern matching the output shards in ``output_dir``."""
    return str(Path(output_dir) / f"{OUTPUT_PREFIX}-*.txt")


def output_files(output_dir: str | Path) -> list[Path]:
    """The output shards in ``output_dir``, sorted by name."""
    return sorted(Path(output_dir).glob(f"{OUTPUT_PREFIX}-*.txt"))


def read_counts(output_dir: str | Path) -> list[str]:
    """All output lines across the shards in ``output_dir``, sorted."""
    lines: Iterable[str] = (
        line
        for path in output_files(output_dir)
        for line in path.read_text(encoding="utf-8").splitlines()
    )
    return sorted(lines)
