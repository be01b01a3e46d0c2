"""State backends: what the SDK's state requests reach inside a Spark task.

Beam's bundle processor asks for state through the Fn API state protocol (``get_raw``,
``append_raw``, ``clear`` by ``StateKey``): side inputs (read-only, loaded once per run and
worker), user state of a stateful DoFn (per key and window), and, with
``--spark_state_backed_iterables``, a bundle's GroupByKey values. :class:`StateBackend` is
the interface the stage worker depends on; in batch, user state lives only while its key is
processed (:meth:`StateBackend.release_user_state`, ``execution.stateful``).
:class:`InMemoryStateBackend` serves everything through Beam's in-memory ``StateServicer``,
as FnApiRunner does; a streaming backend persists user state instead of releasing it.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from beam_spark_runner import beam_internals as bi

# StateKey types that carry user state.
USER_STATE_TYPES: frozenset[str] = frozenset(
    ["bag_user_state", "multimap_user_state", "multimap_keys_user_state", "ordered_list_user_state"]
)
# The StateKey type of state-backed iterables the runner writes for one bundle's input.
ITERABLE_STATE_TYPE = "runner"


class StateBackend(bi.StateHandler):  # type: ignore[misc]
    """The Fn API state operations a bundle processor needs, plus user-state lifetime."""

    @abc.abstractmethod
    def get_raw(
        self, state_key: Any, continuation_token: bytes | None = None
    ) -> tuple[bytes, bytes | None]:
        """The encoded state under ``state_key`` (and a continuation token, if any)."""

    @abc.abstractmethod
    def append_raw(self, state_key: Any, data: bytes) -> Any:
        """Appends encoded ``data`` under ``state_key``; returns a done future."""

    @abc.abstractmethod
    def clear(self, state_key: Any) -> Any:
        """Clears the state under ``state_key``; returns a done future."""

    @abc.abstractmethod
    def release_user_state(self) -> None:
        """Forgets all user state: the keys it belongs to are complete."""

    @abc.abstractmethod
    def write_iterable(self, values: Iterable[Any], element_coder_impl: Any) -> bytes:
        """Stores an iterable's values for the current bundle; returns its state token."""

    @abc.abstractmethod
    def release_iterables(self) -> None:
        """Forgets the iterables written for a bundle that has finished."""

    @abc.abstractmethod
    def user_state_size(self) -> int:
        """How many user-state cells are held (for logging and tests)."""

    @abc.abstractmethod
    def load_side_inputs(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Replaces the side-input contents by ``entries`` (state key, data)."""

    @abc.abstractmethod
    def serve_side_inputs(self, servicer: Any) -> None:
        """Serves side inputs from ``servicer`` (its ``get_raw``) instead of what they were."""

    @abc.abstractmethod
    def export_user_state(self) -> Any:
        """The user state held, as plain data (a streaming shard keeps it between batches).

        It is handed over: the backend holds no user state afterwards.
        """

    @abc.abstractmethod
    def import_user_state(self, contents: Any) -> None:
        """Replaces the user state by what :meth:`export_user_state` returned."""

    @abc.abstractmethod
    def touched_user_state(self) -> set[bytes] | None:
        """The user-state cells used since the last import (None: any may have changed)."""

    @contextlib.contextmanager
    def process_instruction_id(self, unused_instruction_id: Any) -> Iterator[None]:
        """Beam's state handler enters this around each bundle; nothing to do."""
        yield

    def done(self) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Called by Beam's state handler when the bundle ends; nothing to flush here."""


class InMemoryStateBackend(StateBackend):
    """Side inputs and user state in Beam's in-memory ``StateServicer``, one for each."""

    def __init__(self, side_input_entries: Iterable[tuple[bytes, bytes]] = ()) -> None:
        self.load_side_inputs(side_input_entries)
        self._user = bi.StateServicer()
        self._user_cells: set[bytes] = set()
        # Cells the last import brought (not copied into ``_user_cells``: a streaming shard
        # may hold millions, and a batch uses a few).
        self._imported_cells = 0
        # User-state cells read, appended to or cleared since the last import (None: an
        # ordered list's, whose cells the servicer keys by interval: any may have changed).
        self._touched: set[bytes] | None = set()
        self._iterables = bi.StateServicer()
        self._iterable_count = 0

    def _servicer(self, state_key: Any) -> Any:
        state_type = state_key.WhichOneof("type")
        if state_type in USER_STATE_TYPES:
            return self._user
        if state_type == ITERABLE_STATE_TYPE:
            return self._iterables
        return self._side_inputs

    def load_side_inputs(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Replaces the side-input store by one holding ``entries``."""
        self._side_inputs = bi.StateServicer()
        for key, data in entries:
            self._side_inputs.append_raw(bi.beam_fn_api_pb2.StateKey.FromString(key), data)

    def serve_side_inputs(self, servicer: Any) -> None:
        """Serves side inputs from ``servicer``: a ``StateServicer`` or one answering as it."""
        self._side_inputs = servicer

    def write_iterable(self, values: Iterable[Any], element_coder_impl: Any) -> bytes:
        """Encodes the values under a fresh runner state key (Beam's iterable_state_write)."""
        self._iterable_count += 1
        token = b"iterable-%d" % self._iterable_count
        out = bi.create_OutputStream()
        for value in values:
            element_coder_impl.encode_to_stream(value, out, True)
        state_key = bi.beam_fn_api_pb2.StateKey(
            runner=bi.beam_fn_api_pb2.StateKey.Runner(key=token)
        )
        self._iterables.append_raw(state_key, out.get())
        return token

    def release_iterables(self) -> None:
        """Drops the iterables written for the last bundle."""
        if self._iterable_count:
            self._iterables = bi.StateServicer()
            self._iterable_count = 0

    def get_raw(
        self, state_key: Any, continuation_token: bytes | None = None
    ) -> tuple[bytes, bytes | None]:
        """Reads from the side-input or the user-state store, by the key's type."""
        servicer = self._servicer(state_key)
        if servicer is self._user:
            self._touch(state_key)
        return servicer.get_raw(state_key, continuation_token)  # type: ignore[no-any-return]

    def append_raw(self, state_key: Any, data: bytes) -> Any:
        """Appends to the user-state store (side inputs are loaded once, up front)."""
        servicer = self._servicer(state_key)
        if servicer is self._user:
            self._user_cells.add(self._touch(state_key))
        return servicer.append_raw(state_key, data)

    def clear(self, state_key: Any) -> Any:
        """Clears a user-state cell."""
        servicer = self._servicer(state_key)
        if servicer is self._user:
            self._touch(state_key)
        return servicer.clear(state_key)

    def _touch(self, state_key: Any) -> bytes:
        key: bytes = state_key.SerializeToString()
        if self._touched is not None:
            if state_key.WhichOneof("type") == "ordered_list_user_state":
                self._touched = None
            else:
                self._touched.add(key)
        return key

    def touched_user_state(self) -> set[bytes] | None:
        """The user-state cells read, appended to or cleared since the last import.

        None where they cannot be told (an ordered list's cells were): any cell may have
        changed.
        """
        return self._touched

    def release_user_state(self) -> None:
        """Drops every user-state cell at once."""
        if self._user_cells or self._imported_cells:
            self._user = bi.StateServicer()
            self._user_cells.clear()
            self._imported_cells = 0
        self._touched = set()

    def user_state_size(self) -> int:
        """The user-state cells written since the last release, and those imported.

        A cell imported and written again counts twice.
        """
        return len(self._user_cells) + self._imported_cells

    def export_user_state(self) -> Any:
        """The user state held, as plain data; the backend releases it.

        The export shares the servicer's value lists, so nothing may append to them again.
        """
        contents = bi.servicer_contents(self._user, self._touched)
        self._user = bi.StateServicer()
        self._user_cells.clear()
        self._imported_cells = 0
        return contents

    def import_user_state(self, contents: Any) -> None:
        """Replaces the user state by what :meth:`export_user_state` returned.

        The servicer takes ``contents``'s cells as they are (not a copy) where it can: the
        caller hands them over.
        """
        self._user = bi.servicer_with(contents)
        self._user_cells = set()
        self._imported_cells = len(contents[0]) if contents else 0
        self._touched = set()
