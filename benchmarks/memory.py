"""Peak memory of a process tree, sampled from ``/proc`` (Linux).

A benchmark subprocess is the Python driver; a Spark run adds a JVM (a child of the
driver) and PySpark's Python daemon and workers (children of the JVM). The sampler walks
the tree below the root process every ``interval`` seconds; peaks are the largest

* sum of RSS (resident set size, ``VmRSS``) over the tree: what the brief asks for, an
  upper bound, since workers forked from one daemon share copy-on-write pages and each
  counts them in full;
* sum of PSS (proportional set size, ``smaps_rollup``): shared pages split between the
  processes sharing them, closer to the memory the tree really occupies.

The samples are kept with their wall-clock times, so that the peak of a time window (one
workload, when several run in one process) can be taken afterwards. Sampling misses peaks
shorter than the interval; with 0.2 s that is rarely more than a few percent for runs of
seconds or more.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import defaultdict

_LOGGER = logging.getLogger(__name__)
_PROC = "/proc"


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process visible in /proc."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir(_PROC):
        if not entry.isdigit():
            continue
        try:
            with open(f"{_PROC}/{entry}/stat", "rb") as stat:
                data = stat.read()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces: split after it.
        fields = data[data.rfind(b")") + 2 :].split()
        children[int(fields[1])].append(int(entry))
    return children


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants that are alive now."""
    children = _children_map()
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, ()))
    return tree


def _status_kib(pid: int, field: bytes) -> int:
    try:
        with open(f"{_PROC}/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _pss_kib(pid: int) -> int:
    try:
        with open(f"{_PROC}/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_cpu_by_process(root: int) -> dict[int, tuple[str, float]]:
    """pid -> (command line, CPU seconds so far) for ``root`` and its descendants.

    A process's figure includes the CPU of its children that exited and were reaped
    (``cutime``, ``cstime``): forked Python workers that ended count in their daemon.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    usage: dict[int, tuple[str, float]] = {}
    for pid in process_tree(root):
        try:
            with open(f"{_PROC}/{pid}/stat", "rb") as stat:
                data = stat.read()
            with open(f"{_PROC}/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        # After the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
        usage[pid] = (command, sum(int(value) for value in fields[11:15]) / ticks)
    return usage


def tree_cpu_seconds(root: int) -> float:
    """CPU time (user + system) used so far by ``root`` and its descendants, in seconds.

    Live processes count their own time; processes that exited and were reaped by a parent
    in the tree count in that parent's children's time. The difference of two readings is
    the CPU the tree used in between, whatever the machine's load: on a shared machine a
    steadier measure of work than wall time.
    """
    return sum(cpu for _, cpu in tree_cpu_by_process(root).values())


@dataclasses.dataclass
class TreeMemory:
    """Peaks observed over a process tree's life (or a window of it), in MiB."""

    peak_rss_mib: float = 0.0
    peak_pss_mib: float = 0.0
    peak_processes: int = 0
    samples: int = 0


@dataclasses.dataclass(frozen=True)
class Sample:
    """One observation of the tree: wall-clock time (``time.time()``), RSS, PSS, processes."""

    at: float
    rss_mib: float
    pss_mib: float
    processes: int


def peaks(samples: list[Sample], start: float = 0.0, end: float = float("inf")) -> TreeMemory:
    """The peaks of the samples taken between ``start`` and ``end`` (wall-clock times)."""
    window = [s for s in samples if start <= s.at <= end]
    if not window:
        return TreeMemory()
    return TreeMemory(
        peak_rss_mib=max(s.rss_mib for s in window),
        peak_pss_mib=max(s.pss_mib for s in window),
        peak_processes=max(s.processes for s in window),
        samples=len(window),
    )


class TreeMemorySampler:
    """Samples the memory of the tree below ``root`` in a background thread."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root = root
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-memory", daemon=True)

    def sample(self) -> None:
        """Takes one sample of the tree."""
        tree = process_tree(self.root)
        rss = sum(_status_kib(pid, b"VmRSS:") for pid in tree) / 1024
        pss = sum(_pss_kib(pid) for pid in tree) / 1024
        self.samples.append(Sample(time.time(), rss, pss, len(tree)))

    @property
    def result(self) -> TreeMemory:
        """Peaks over all samples so far."""
        return peaks(self.samples)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a failed sample must not end the benchmark
                _LOGGER.debug("memory sample failed", exc_info=True)
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
