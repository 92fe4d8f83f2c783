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

__all__ = [
    "all_gather_beside_gemm_reference",
    "all_gather_gemm_reference",
    "all_gather_rows",
    "gemm_reduce_scatter_reference",
    "reduce_scatter_beside_gemm_reference",
    "reduce_scatter_rows",
]


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


# ---- bulk overlap (overlap.ops.bulk) ---------------------------------------------------------


def _side_gemm_reference(op: str, a: Operand, b: Operand, gemm_kwargs: dict) -> torch.Tensor:
    """The side GEMM of a bulk op, run on its own by :func:`overlap.gemm.gemm`."""
    from overlap.ops.bulk import side_gemm

    g = side_gemm(op, a, b, _operand_device(a), **gemm_kwargs)
    gemm(
        g["a"],
        g["b"],
        out=g["out"],
        transa=g["transa"],
        transb=g["transb"],
        alpha=g["alpha"],
        beta=g["beta"],
        bias=g["bias"],
        gelu=g["gelu"],
        a_scale_inv=g["a_scale_inv"],
        b_scale_inv=g["b_scale_inv"],
        out_scale=g["out_scale"],
        out_amax=g["out_amax"],
        fast_accum=g["fast_accum"],
        sm_count=g["sm_count"],
    )
    return g["out"]


def _operand_device(x: Operand) -> torch.device:
    from overlap.quantization import QuantizedTensor

    return x.rowwise_data.device if isinstance(x, QuantizedTensor) else x.device


def all_gather_beside_gemm_reference(
    x_shard: Operand, a: Operand, b: Operand, *, group: object = None, **gemm_kwargs: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gathered, y)``: ``gathered = AllGather(x_shard)`` (the data; FP8 stays FP8: gather
    the scale_invs with :func:`all_gather_rows` of ``x_shard.rowwise_scale_inv``) and the
    side GEMM ``y = gemm(a, b, **gemm_kwargs)`` (the keywords of
    :class:`~overlap.ops.AllGatherBesideGemm`), one after the other."""
    data, _ = split_operand("bulk_all_gather reference", "x_shard", x_shard)
    gathered = all_gather_rows(data, group)
    return gathered, _side_gemm_reference("bulk_all_gather reference", a, b, dict(gemm_kwargs))


def reduce_scatter_rows(
    x: torch.Tensor,
    *,
    group: object = None,
    out_dtype: torch.dtype | None = None,
    out_scale: torch.Tensor | None = None,
    out_amax: torch.Tensor | None = None,
    exact: bool = True,
) -> torch.Tensor:
    """This rank's rows of ``sum over ranks (x)`` (``x`` ``[M, N]``, ``M`` a multiple of the
    TP size). ``exact=True`` sums in rank order with fp32 accumulation after an all-gather,
    as the bulk op does (the test oracle); ``exact=False`` calls the library's reduce-scatter
    (NCCL's on GPUs: the benchmark's baseline). FP8 ``out_dtype``: cast with ``out_scale``
    (``out_amax`` receives ``max |sum|``)."""
    import torch
    import torch.distributed as dist

    tp = dist.get_world_size(group)
    if x.dim() != 2 or x.shape[0] % tp:
        raise InvalidArgumentError(
            f"reduce_scatter reference: x {tuple(x.shape)} must be 2-D with rows a multiple of "
            f"the TP size {tp}"
        )
    out_dtype = out_dtype or x.dtype
    if exact:
        everyone = all_gather_rows(x.contiguous().unsqueeze(0), group)  # [tp, M, N]
        mine = everyone.chunk(tp, dim=1)[dist.get_rank(group)].float()
        acc = mine[0].clone()
        for k in range(1, tp):
            acc += mine[k]
    else:
        acc = torch.empty((x.shape[0] // tp, x.shape[1]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(acc, x.contiguous(), group=group)
    if is_fp8(out_dtype):
        if out_scale is None:
            raise InvalidArgumentError("reduce_scatter reference: an FP8 output needs out_scale")
        out, _ = cast_to_fp8(
            acc.float().contiguous(), out_scale, fp8_dtype=out_dtype, amax=out_amax
        )
        return out
    return acc.to(out_dtype)


def reduce_scatter_beside_gemm_reference(
    x: torch.Tensor,
    a: Operand,
    b: Operand,
    *,
    group: object = None,
    out_dtype: torch.dtype | None = None,
    out_scale: torch.Tensor | None = None,
    out_amax: torch.Tensor | None = None,
    exact: bool = True,
    **gemm_kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, y)``: :func:`reduce_scatter_rows` of ``x`` and the side GEMM
    ``y = gemm(a, b, **gemm_kwargs)`` (``transa``, ``transb``, ``out``, ``out_dtype``, ... as
    :func:`overlap.gemm.gemm`; the ``gemm_out*`` names of
    :class:`~overlap.ops.ReduceScatterBesideGemm` are spelled without the prefix here), one
    after the other."""
    out = reduce_scatter_rows(
        x, group=group, out_dtype=out_dtype, out_scale=out_scale, out_amax=out_amax, exact=exact
    )
    return out, _side_gemm_reference("bulk_reduce_scatter reference", a, b, dict(gemm_kwargs))
