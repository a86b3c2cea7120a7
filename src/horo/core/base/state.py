"""Process-global runtime state and the single guard every entry point goes through."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from .errors import NotInitializedError

__all__ = ["ProcessSet", "State", "global_process_set", "require_init", "state"]


class State:
    """Everything ``horo.init()`` sets up; reset by ``horo.shutdown()``."""

    def __init__(self) -> None:
        self.initialized = False
        self.lock = threading.RLock()
        self.world: Any = None  # mpi4py communicator, a duplicate (comms.duplicate) of the one given to init
        self.local: Any = None
        self.cross: Any = None
        self.homogeneous = True
        self.process_sets: dict[int, ProcessSet] = {}
        self.next_process_set_id = 1
        self.fatal: BaseException | None = None  # set when the engine hit an unrecoverable error
        # Set when a peer process died (ULFM): collectives raise it until horo.elastic rebuilds the world.
        self.failed: BaseException | None = None
        self.leaving = False  # inside shutdown(): peers waiting for this rank on a process set must not hang

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


state = State()


def require_init(what: str = "this function") -> State:
    """Return the state, or raise the one "not initialized" error.

    Args:
        what: the name of the API the user called, for the message.
    """
    if not state.initialized:
        raise NotInitializedError(
            f"horo has not been initialized: {what} was called before horo.init(). "
            "HINT: call horo.init() (or hvd.init() with `import horo.keras as hvd`) at the top of your "
            "script, before any other horo call."
        )
    if state.fatal is not None:
        raise state.fatal
    return state


class ProcessSet:
    """A fixed group of global ranks that can run collectives among themselves.

    Args:
        ranks: the global ranks in the set (any order, no duplicates).
    """

    def __init__(self, ranks: Sequence[int]) -> None:
        if isinstance(ranks, ProcessSet):
            ranks = ranks.ranks
        try:
            ranks_list = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise TypeError(
                f"ProcessSet needs a sequence of integer ranks. Received: ranks={ranks!r}. "
                "HINT: horo.ProcessSet([0, 1])."
            ) from None
        if len(set(ranks_list)) != len(ranks_list):
            raise ValueError(f"ProcessSet ranks must be unique. Received: ranks={ranks_list}.")
        self.ranks: list[int] = sorted(ranks_list)
        self.process_set_id: int | None = None
        self.comm: Any = None  # direct (synchronous) collectives
        self.engine_comm: Any = None  # the background engine's own communicator
        self.engine: Any = None

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set (-1 if not included)."""
        require_init("ProcessSet.rank()")
        me = state.world.Get_rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        require_init("ProcessSet.included()")
        return state.world.Get_rank() in self.ranks

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and other.ranks == self.ranks

    def __hash__(self) -> int:
        return hash(tuple(self.ranks))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
"""The set of all ranks (id 0), the default ``process_set`` of every collective."""
global_process_set.process_set_id = 0
