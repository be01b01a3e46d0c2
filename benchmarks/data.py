"""Generated input data: a text file of words for the word count.

The file is written once per size and reused (it is deterministic); a JSON file beside
it records how many words it holds, which the word count reports as its element count.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import string
from pathlib import Path

_LOGGER = logging.getLogger(__name__)

VOCABULARY_SIZE = 50_000
_SEED = 20240611


def _vocabulary(rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < VOCABULARY_SIZE:
        length = rng.randint(2, 10)
        words.add("".join(rng.choices(string.ascii_lowercase, k=length)))
    return sorted(words)


def text_file(directory: Path, megabytes: float) -> tuple[Path, int]:
    """A text file of about ``megabytes`` MB of words and its word count, created if absent.

    Words follow a Zipf-like distribution over a 50 000-word vocabulary; lines hold 5 to
    20 words separated by single spaces (so ``str.split()`` and Spark SQL's
    ``split(value, ' ')`` agree).
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"words-{megabytes:g}mb.txt"
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("vocabulary") == VOCABULARY_SIZE and meta.get("seed") == _SEED:
            return path, int(meta["words"])
    _LOGGER.info("Generating %s (%g MB of words)", path, megabytes)
    rng = random.Random(_SEED)
    vocabulary = _vocabulary(rng)
    cumulative = list(itertools.accumulate(1.0 / rank for rank in range(1, VOCABULARY_SIZE + 1)))
    target = int(megabytes * 1_000_000)
    written = words = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="ascii") as out:
        while written < target:
            # About 7.3 bytes per word with its separator: small files stay small.
            block_words = max(1_000, min(100_000, (target - written) // 7))
            chosen = rng.choices(vocabulary, cum_weights=cumulative, k=block_words)
            lines = []
            position = 0
            while position < len(chosen):
                count = rng.randint(5, 20)
                lines.append(" ".join(chosen[position : position + count]))
                position += count
            block = "\n".join(lines) + "\n"
            out.write(block)
            written += len(block)
            words += len(chosen)
    tmp.replace(path)
    meta_path.write_text(json.dumps({"words": words, "vocabulary": VOCABULARY_SIZE, "seed": _SEED}))
    _LOGGER.info("Wrote %s: %d bytes, %d words", path, written, words)
    return path, words
