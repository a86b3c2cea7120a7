"""Elastic training over MPI with ULFM (Horovod's ``horovod.*.elastic`` API, framework-free part).

``@run`` calls a training function again after a worker dies (the survivors keep their Python state and
roll back to the last ``commit()``) or after hororun's driver reports new slots (new workers join and get
the state by ``sync()``). Per-framework states live next to the facades (``horo.torch.elastic``, ...).
"""

from .errors import ElasticError, HoroInternalError, HorovodInternalError, HostsUpdatedInterrupt
from .runner import reset_count, run
from .state import ObjectState, State

__all__ = ["run", "State", "ObjectState", "HostsUpdatedInterrupt", "HoroInternalError", "HorovodInternalError",
           "ElasticError", "reset_count"]
