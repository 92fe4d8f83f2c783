"""Issue 32, item 4: set-up has a deadline. A peer that dies (SIGKILL) or hangs during the
collective set-up (Communicator(), create_buffer(), initialize_ub()) made its peers block in
the bootstrap for good and left its segment in /dev/shm; every live rank now raises a typed
error within the deadline and nothing stays behind (NOTE [set-up deadlines] in
overlap/comm/_setup.py). Plain processes, no mpirun: mpirun would end the job when a rank dies.
"""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_local_ranks


@pytest.mark.parametrize(
    ("scenario", "nprocs"),
    [("die_in_create", 3), ("hang_in_communicator", 2), ("die_in_initialize_ub", 2)],
    ids=str,
)
def test_a_dead_or_absent_peer_fails_the_set_up_in_time(scenario: str, nprocs: int) -> None:
    killed = [nprocs - 1] if scenario.startswith("die") else []
    run_local_ranks("setup_worker.py", nprocs, [scenario], killed=killed, timeout_s=120)
