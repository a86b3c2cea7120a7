"""Process-global runtime state and the single guard every entry point goes through."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .errors import NotInitializedError

if TYPE_CHECKING:
    from ..api.process_sets import ProcessSet

__all__ = ["State", "state", "require_init"]


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
