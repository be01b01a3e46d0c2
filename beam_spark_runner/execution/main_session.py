"""``--save_main_session``: the driver's main script, restored in Spark's Python workers.

Spark's workers are not Beam's SDK harness, so the runner does what Beam's portable runners
and harness do: the driver captures the session once per run (``pickler.dump_session``:
the whole ``__main__`` under dill, only Beam's registries under cloudpickle) and each worker
process restores it on its first task of the run (``beam_globals.enter_run``). Classes
defined in ``__main__`` would still fail where pickled by reference (Beam's ``PickleCoder``,
dill's session for self-referring classes), so the runner also pickles them by value with
cloudpickle into the worker's ``__main__``; cloudpickle keeps one identity per class in a
process, so the class DoFns build and the one found by name are the same.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from dataclasses import dataclass

from beam_spark_runner import beam_internals as bi

_LOGGER = logging.getLogger(__name__)

_lock = threading.Lock()

# Where a worker without the main session fails on a name of the main script: pickle's
# "Can't pickle <class '__main__.X'>: attribute lookup X on __main__ failed" and
# "Can't get attribute 'X' on <module ...>" (the worker's __main__, e.g. PySpark's daemon).
_MISSING_MAIN_NAME_MARKERS = ("on __main__ failed", "Can't get attribute '")
# With dill, a DoFn's globals are the worker's __main__: a main-script name is undefined.
_DILL_MISSING_NAME_MARKER = "NameError: name '"

SAVE_MAIN_SESSION_HINT = (
    "A class or name defined in the main script (__main__) seems not to be available in "
    "Spark's Python workers. Run with --save_main_session (as on Beam's portable runners), "
    "or move that code into a module the workers can import."
)


@dataclass(frozen=True)
class MainSession:
    """A main session captured on the driver: Beam's session file and main-script classes."""

    beam_session: bytes
    main_classes: bytes | None


def _main_classes() -> dict[str, type]:
    main = sys.modules.get("__main__")
    return {
        name: value
        for name, value in vars(main).items()
        if isinstance(value, type) and getattr(value, "__module__", None) == "__main__"
    }


def capture(pickle_library: str) -> MainSession | None:
    """The driver's main session, pickled with ``pickle_library`` (already set).

    None when it cannot be pickled; a warning says why, and the run goes on without it.
    """
    with tempfile.TemporaryDirectory(prefix="beam-main-session-") as directory:
        path = os.path.join(directory, "main_session.pickle")
        try:
            beam_session = bi.dump_main_session(path)
            classes = _main_classes()
            main_classes = bi.cloudpickle_dumps(classes) if classes else None
        except Exception as error:  # noqa: BLE001 - any pickling failure: go on without
            _LOGGER.warning(
                "--save_main_session: could not pickle the main session (%s: %s); workers "
                "run without it. Move what cannot be pickled (open files, sessions, locks) "
                "out of the main script's globals.",
                type(error).__name__,
                error,
            )
            return None
    _LOGGER.debug(
        "Main session captured: %d bytes, %d main-script classes",
        len(beam_session),
        len(classes),
    )
    return MainSession(beam_session, main_classes)


def restore(session: MainSession) -> None:
    """Loads ``session`` into this worker process's ``__main__`` (worker side)."""
    with _lock:
        classes = (
            bi.cloudpickle_loads(session.main_classes) if session.main_classes is not None else {}
        )
        main = sys.modules["__main__"]
        # First, so that the session's references to them by name resolve (dill pickles a
        # class that refers to itself, as a frozen dataclass does, by name)...
        vars(main).update(classes)
        with tempfile.TemporaryDirectory(prefix="beam-main-session-") as directory:
            path = os.path.join(directory, "main_session.pickle")
            with open(path, "wb") as file:
                file.write(session.beam_session)
            bi.load_main_session(path)
        # ...and again, so that each name is one class: the one DoFns pickled with
        # cloudpickle resolve to and the one the session's code finds in __main__.
        vars(main).update(classes)


def missing_main_names(failure_text: str, pickle_library: str) -> bool:
    """Whether a worker's failure looks like a main-script name it could not find."""
    if pickle_library == "dill" and _DILL_MISSING_NAME_MARKER in failure_text:
        return True
    return any(marker in failure_text for marker in _MISSING_MAIN_NAME_MARKERS)
