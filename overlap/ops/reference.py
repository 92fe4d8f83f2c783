"""Reference implementations of the overlap ops: a plain collective, then a plain GEMM.

They are the oracle of the tests and the no-overlap baseline of the benchmark (NCCL +
cuBLASLt on GPUs, gloo + the host GEMM on CPUs). They take the same operands as
:class:`~overlap.ops.AllGatherGemm` / :class:`~overlap.ops.GemmReduceScatter` and a
``torch.distributed`` process group whose rank order is the TP group's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overlap.errors import InvalidArgumentError
from overlap.gemm import gemm
from overlap.ops._operands import Operand, default_fast_accum, is_fp8, split_operand
from overlap.ops.gemm_rs import partial_dtype
from overlap.quantization import cast_to_fp8

if TYPE_CHECKING:
    import torch

__all__ = ["all_gather_gemm_reference", "all_gather_rows", "gemm_reduce_scatter_reference"]


def all_gather_rows(x: torch.Tensor, group: object = None) -> torch.Tensor:
    """``[tp * rows, ...]``: every rank's ``x`` stacked in group-rank order (NCCL's
    all_gather_into_tensor, or gloo's all_gather through host memory). FP8 travels as bytes."""
    import torch
    import torch.distributed as dist

    raw = x.contiguous()
    if is_fp8(raw.dtype):
        raw = raw.view(torch.uint8)
    tp = dist.get_world_size(group)
    if dist.get_backend(group) == "nccl":
        out = torch.empty((tp * raw.shape[0], *raw.shape[1:]), dtype=raw.dtype, device=raw.device)
        dist.all_gather_into_tensor(out, raw, group=group)
    else:  # gloo: through host memory
        parts = [torch.empty_like(raw, device="cpu") for _ in range(tp)]
        dist.all_gather(parts, raw.cpu(), group=group)
        out = torch.cat(parts).to(raw.device)
    return out.view(x.dtype) if is_fp8(x.dtype) else out


def all_gather_gemm_reference(
    x_shard: Operand,
    weight: Operand,
    *,
    group: object = None,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    alpha: float = 1.0,
    out_dtype: torch.dtype | None = None,
    fast_accum: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Y, gathered)``: ``gathered = AllGather(x_shard)`` (the data; FP8 stays FP8), then
    ``Y = gemm(gathered, weight.T)``. FP8 shards whose ranks' scale_invs differ are multiplied
    chunk by chunk, each with its own scale_inv (as the overlapped op does); otherwise in one
    GEMM."""
    import torch

    a, a_scale_inv = split_operand("ag_gemm reference", "x_shard", x_shard)
    b, b_scale_inv = split_operand("ag_gemm reference", "weight", weight)
    gathered = all_gather_rows(a, group)
    fp8 = is_fp8(a.dtype)
    fast = default_fast_accum(fast_accum, fp8)
    if out_dtype is None:
        out_dtype = torch.bfloat16 if fp8 else a.dtype
    common = dict(transb=True, bias=bias, gelu=gelu, alpha=alpha, b_scale_inv=b_scale_inv)
    if not fp8:
        return gemm(gathered, b, out_dtype=out_dtype, **common), gathered
    scales = all_gather_rows(a_scale_inv.reshape(1), group)
    if bool((scales == scales[0]).all()):
        y = gemm(
            gathered, b, out_dtype=out_dtype, a_scale_inv=scales[:1], fast_accum=fast, **common
        )
        return y, gathered
    m = a.shape[0]
    y = torch.empty((gathered.shape[0], b.shape[0]), dtype=out_dtype, device=a.device)
    for j in range(scales.numel()):
        gemm(
            gathered[j * m : (j + 1) * m],
            b,
            out=y,
            row_offset=j * m,
            # A fresh (aligned) scale: cuBLASLt refuses a scale pointer 4 bytes into a tensor.
            a_scale_inv=scales[j : j + 1].clone(),
            fast_accum=fast,
            **common,
        )
    return y, gathered


def gemm_reduce_scatter_reference(
    x: Operand,
    weight: Operand,
    *,
    group: object = None,
    alpha: float = 1.0,
    out_dtype: torch.dtype | None = None,
    out_scale: torch.Tensor | None = None,
    out_amax: torch.Tensor | None = None,
    fast_accum: bool | None = None,
    exact: bool = True,
) -> torch.Tensor:
    """This rank's rows of ``sum over ranks (alpha * x @ weight.T)``.

    The partial sums are computed in :func:`~overlap.ops.gemm_rs.partial_dtype` (as the
    overlapped op keeps them). ``exact=True`` sums them like the overlapped op, in rank order
    with fp32 accumulation after an all-gather (the test oracle: bit-exact for equal partial
    sums); ``exact=False`` calls the library's reduce-scatter (NCCL's, on GPUs: the
    benchmark's baseline). FP8 outputs are cast with ``out_scale`` (``out_amax`` receives
    ``max |sum|``).
    """
    import torch
    import torch.distributed as dist

    a, a_scale_inv = split_operand("gemm_rs reference", "x", x)
    b, b_scale_inv = split_operand("gemm_rs reference", "weight", weight)
    tp = dist.get_world_size(group)
    if a.shape[0] % tp:
        raise InvalidArgumentError(
            f"gemm_rs reference: {a.shape[0]} rows are not a multiple of the TP size {tp}"
        )
    if out_dtype is None:
        out_dtype = torch.bfloat16 if is_fp8(a.dtype) else a.dtype
    part = gemm(
        a,
        b,
        transb=True,
        alpha=alpha,
        a_scale_inv=a_scale_inv,
        b_scale_inv=b_scale_inv,
        out_dtype=partial_dtype(out_dtype),
        fast_accum=default_fast_accum(fast_accum, is_fp8(a.dtype)),
    )
    if exact:
        everyone = all_gather_rows(part.unsqueeze(0), group)  # [tp, M, N]
        mine = everyone.chunk(tp, dim=1)[dist.get_rank(group)].float()
        acc = mine[0].clone()
        for k in range(1, tp):
            acc += mine[k]
    else:
        acc = torch.empty((a.shape[0] // tp, b.shape[0]), dtype=part.dtype, device=a.device)
        dist.reduce_scatter_tensor(acc, part, group=group)
    if is_fp8(out_dtype):
        if out_scale is None:
            raise InvalidArgumentError("gemm_rs reference: an FP8 output needs out_scale")
        out, _ = cast_to_fp8(
            acc.float().contiguous(), out_scale, fp8_dtype=out_dtype, amax=out_amax
        )
        return out
    return acc.to(out_dtype)
