"""Communicator.abort() on GPUs (workers/abort_worker.py): a GPU wait ends within 100 ms of an
abort from another thread, the GPU stays usable, later ops fail at once and the peer fails
through the poisoned flags before its deadline. The host transport's abort, Ctrl-C and
destroy-while-in-use cases are tests/unit/test_comm_abort.py (CI)."""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_local_ranks


@pytest.mark.gpu(2)
def test_cuda_abort_ends_the_gpu_wait_and_fails_the_peer() -> None:
    out = run_local_ranks("abort_worker.py", 2, [], timeout_s=120)
    print(out)
    assert "synchronize raised" in out and "rank 1:" in out, out
