"""Extra methods for the overlap benchmark's tests, added with ``--import`` (the way a method
under development is timed without editing benchmarks/methods.py): one built on torch through
``Case.group`` (the reference ops) and one whose builder refuses on rank 1 only."""

from __future__ import annotations

import torch.distributed as dist

from benchmarks.methods import Case, Runner, register
from overlap.errors import InvalidArgumentError
from overlap.ops import all_gather_gemm_reference, gemm_reduce_scatter_reference


def _ag_reference(case: Case) -> Runner:
    return lambda: all_gather_gemm_reference(case.a, case.w, group=case.group)


def _rs_reference(case: Case, *, exact: bool) -> Runner:
    return lambda: gemm_reduce_scatter_reference(case.a, case.w, group=case.group, exact=exact)


def _refused_on_rank_1(case: Case) -> Runner:
    if dist.get_rank() == 1:
        raise InvalidArgumentError("test-broken: refused on rank 1 only")
    return lambda: case.out.fill_(1.0)


register("ag_gemm", "test-reference", _ag_reference)
register("gemm_rs", "test-reference", _rs_reference, [{"exact": True}])
register("gemm_rs", "test-broken", _refused_on_rank_1)
