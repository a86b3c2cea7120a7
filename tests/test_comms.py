"""horo makes its communicators with comms.duplicate (a Split), never MPI_Comm_dup or MPI_Comm_create.

On Open MPI 5.0.11 a Dup or Create as a process's first exchange left both directions between two hosts on
one TCP connection, halving later transfers (docs/multihost.md, "Communicators: Split, never Dup"); the
bandwidth itself is measured by the benches, not here. This keeps the calls from coming back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it

SRC = Path(__file__).resolve().parent.parent / "src" / "horo"
# init(comm=[ranks]): MPI_Comm_create_group is collective over the listed ranks only, which Split is not.
# add_process_set_of_members (torch.distributed.new_group): the same, over the set's members.
ALLOWED = {
    ("core/api/runtime.py", "base = MPI.COMM_WORLD.Create_group(group)"),
    ("core/api/process_sets.py", "comm = st.world.Create_group(group, sum(ps.ranks) % 32768)"),
}
CALL = re.compile(r"\.(Dup|Idup|Create|Create_group)\(")


def test_no_dup_or_create_of_communicators() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0].strip()
            # Info.Create and Op.Create make an MPI info object and a reduction operation, not communicators.
            if CALL.search(code) and not re.search(r"\b(Info|Op)\.Create\(", code) and (rel, code) not in ALLOWED:
                found.append(f"{rel}: {code}")
    assert not found, "use horo.core.transport.comms.duplicate instead:\n" + "\n".join(found)
