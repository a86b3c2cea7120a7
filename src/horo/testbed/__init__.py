"""An emulated cluster in Linux network namespaces, for multi-host tests and benchmarks (needs root).

``python -m horo.testbed up --hosts 3 --slots 2 [--rate 1gbit] [--slurm]``, ``exec HOST CMD...``, ``ssh-agent``,
``down``; see :mod:`horo.testbed.bed` for the layout (``control`` acts on a running bed) and docs/multihost.md
for how to use it, and :mod:`horo.testbed.slurm` (docs/cluster.md) for the SLURM cluster ``--slurm`` starts on it.
"""

from __future__ import annotations

from .bed import HEAD, SUBNET, Bed, Host, TestbedError, down, load, state_dir, unsupported_reason, up
from .control import exec_argv, host_pids, kill_host, link_bytes, set_link

__all__ = [
    "HEAD", "SUBNET", "Bed", "Host", "TestbedError", "down", "exec_argv", "host_pids", "kill_host", "link_bytes",
    "load", "set_link", "state_dir", "unsupported_reason", "up",
]
