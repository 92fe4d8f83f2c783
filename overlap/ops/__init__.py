"""Comm-GEMM overlap ops: tensor-parallel communication hidden behind the GEMM.

* :class:`AllGatherGemm`: ``Y = AllGather(x_shard) @ W.T`` (sequence-parallel input).
* :class:`GemmReduceScatter`: ``Y_shard = ReduceScatter(x @ W_shard.T)``, pipelined or as a
  ring (:class:`RsMethod`).
* :class:`AllGatherBesideGemm` / :class:`ReduceScatterBesideGemm`: bulk overlap, one
  collective of one tensor beside an unrelated GEMM (:mod:`overlap.ops.bulk`).
* :mod:`overlap.ops.reference`: the same results from a plain collective and a plain GEMM.

Each op object owns a symmetric buffer of its communicator sized for its largest shape; calls
are COLLECTIVE over the TP group and follow the stream contract of
:mod:`overlap.comm.communicator`.
"""

from overlap.ops.ag_gemm import AllGatherGemm
from overlap.ops.bulk import AllGatherBesideGemm, ReduceScatterBesideGemm
from overlap.ops.gemm_rs import GemmReduceScatter, RsMethod, partial_dtype
from overlap.ops.reference import (
    all_gather_beside_gemm_reference,
    all_gather_gemm_reference,
    all_gather_rows,
    gemm_reduce_scatter_reference,
    reduce_scatter_beside_gemm_reference,
    reduce_scatter_rows,
)

__all__ = [
    "AllGatherBesideGemm",
    "AllGatherGemm",
    "GemmReduceScatter",
    "ReduceScatterBesideGemm",
    "RsMethod",
    "all_gather_beside_gemm_reference",
    "all_gather_gemm_reference",
    "all_gather_rows",
    "gemm_reduce_scatter_reference",
    "partial_dtype",
    "reduce_scatter_beside_gemm_reference",
    "reduce_scatter_rows",
]
