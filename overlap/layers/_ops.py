"""The communicating steps of the layers as ``torch.library`` custom ops.

NOTE [layer custom ops]: every step of a tensor-parallel linear that communicates is one
custom op (``overlap::column_forward``, ``column_backward``, ``row_forward``,
``row_backward``, ``tp_all_reduce``) with a fake (meta) implementation, so ``torch.compile``
traces a layer's forward and backward without graph breaks: the ops are opaque nodes whose
output shapes the fake implementations give. Each op is a whole pass of a linear (the
collective, its GEMMs and, in backward, whatever the buffer keeps between them), for two
reasons: a compiler may reorder independent nodes but never splits one, so nothing another
op could overwrite is ever read across two nodes (a gathered input kept in a symmetric
buffer lives only inside its op, docs/design.md §3, invariant 2); and the schema stays
small. Operands arrive GEMM-ready (high-precision tensors, or FP8 data with its float32
``[1]`` scale_inv) because quantizers are Python objects that no schema carries; the layer's
autograd function quantizes. Groups arrive as ids (NOTE [group ids] in ``_tp.py``).
Outputs are always new tensors, never views of a symmetric buffer.

The schedules (docs/design.md §9), per step, with userbuffers (``ub``) or plain collectives:

=====================  =================================================  ====================
step                   with ub                                            without
=====================  =================================================  ====================
column forward         AG+GEMM of the input shard                         all-gather, GEMM
column dgrad           bulk AG of the saved shard beside ``dX = dY W``     all-gather, GEMM
                       (or GEMM+RS of dgrad, ``rs_dgrad``)
column wgrad           bulk RS of dgrad beside ``dW = dY^T X``             reduce-scatter, GEMM
row forward            GEMM+RS                                            GEMM, reduce-scatter
row dgrad              AG+GEMM of dY, keeping the gathered dY             all-gather, GEMM
row wgrad              ``dW = AG(dY)^T X`` from the kept dY, same op      GEMM
=====================  =================================================  ====================
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from overlap.gemm import gemm
from overlap.layers._tp import TensorParallelGroup, lookup_group
from overlap.quantization import (
    DirectionFormat,
    QuantizedTensor,
    ScalingMode,
    direction_format,
    transpose_fp8,
)
from overlap.ub import PlanPolicy, ShapeKey
from overlap.ub.plans import OP, SEQUENTIAL

__all__ = [
    "column_backward",
    "column_forward",
    "dispatch",
    "row_backward",
    "row_forward",
    "tp_all_reduce",
]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _is_fp8(t: torch.Tensor) -> bool:
    return t.dtype in _FP8


def _operand(data: torch.Tensor, scale_inv: torch.Tensor | None) -> torch.Tensor | QuantizedTensor:
    """What the overlap ops take: a plain tensor, or FP8 data with its scale_inv as a
    per-tensor :class:`QuantizedTensor` (rowwise)."""
    if scale_inv is None:
        return data
    return QuantizedTensor(
        shape=tuple(data.shape),
        dtype=torch.bfloat16,
        rowwise_format=_per_tensor_format(data.dtype),
        columnwise_format=_NO_FORMAT,
        rowwise_data=data,
        rowwise_scale_inv=scale_inv,
    )


def _per_tensor_format(fp8: torch.dtype) -> DirectionFormat:
    """The rowwise format of per-tensor FP8 data of dtype ``fp8``: the one shared object of
    :func:`~overlap.quantization.formats.direction_format`, which the quantizers' outputs
    carry too (the ops' plan keys, NOTE [op plans], compare it by identity first)."""
    return direction_format(ScalingMode.TENSOR, fp8)


_NO_FORMAT = direction_format()  # a direction without data


def _transpose(t: torch.Tensor) -> torch.Tensor:
    """The ``[cols, rows]`` transpose of gathered FP8 data ``[rows, cols]``, a new tensor
    (NOTE [fp8 transpose] in csrc/kernels/transpose.h); other dtypes through PyTorch."""
    if _is_fp8(t):
        return transpose_fp8(t)
    return t.t().contiguous()


def _planned_op(
    tp: TensorParallelGroup,
    name: str,
    shape: tuple[int, int, int],
    x: torch.Tensor,
    *,
    call: Callable[[Any], Any],
    run_sequential: Callable[[], Any],
) -> Any:
    """The op object that this call of GEMM ``name`` (``shape`` = M, K, N; ``x`` its input)
    runs, or None for the sequential path: the handle's plan for the shape (NOTE [shape plans]
    in ``overlap/ub/plans.py``) among its op, the op's alternate settings (NOTE [plan
    alternates] in ``overlap/ub/config.py``) and ``run_sequential``; ``call(op)`` runs one
    call of an op. Under PlanPolicy.ALWAYS the op, at no cost."""
    ub = tp.userbuffers(name)
    op = ub.get(name)
    if ub.plans.policy is PlanPolicy.ALWAYS:
        return op
    key = ShapeKey(name, *shape, _is_fp8(x))
    chosen = ub.plans.planned(key)  # later calls of a shape: a lookup, nothing built
    if chosen is None:
        ops = {OP: op, **ub.alternates(name)}
        paths = {label: functools.partial(call, candidate) for label, candidate in ops.items()}
        paths[SEQUENTIAL] = run_sequential
        chosen = ub.plans.choose(
            key, paths, lambda values: tp.all_reduce_max(values, x.device),
            cuda=x.device.type == "cuda", barrier=lambda: tp.device_barrier(x.device),
        )  # fmt: skip
    if chosen == SEQUENTIAL:
        return None
    return op if chosen == OP else ub.alternates(name)[chosen]


def _kept_gather(
    op: Any, scale_inv: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gathered input ``op`` kept in its buffer: a view, read before the buffer's next op
    (NOTE [layer custom ops]), and its scale_inv: FP8's from the buffer too (invariant 1),
    else ``scale_inv`` as given."""
    gathered = op.gathered_input(check_scales=False)
    if isinstance(gathered, QuantizedTensor):
        return gathered.rowwise_data, gathered.rowwise_scale_inv
    return gathered, scale_inv


def _check_tokens(tp: TensorParallelGroup, tokens: int, what: str) -> None:
    ub = tp.ub
    if ub is not None and tokens > ub.config.tokens:
        from overlap.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{what}: {tokens} tokens, but the userbuffers were sized for at most "
            f"{ub.config.tokens} (initialize_ub((tokens, hidden), ...)); size them for the "
            "largest batch"
        )


# ---- column-parallel ---------------------------------------------------------------------------


def _column_forward(  # noqa: PLR0917 (a schema is positional)
    x: torch.Tensor,
    x_scale_inv: torch.Tensor | None,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor | None,
    bias: torch.Tensor | None,
    group_id: int,
    gemm_name: str,
    overlap: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``Y [tp*m, N] = AllGather(x [m, K]) @ weight[N, K]^T (+ bias)``."""
    tp = lookup_group(group_id)
    _check_tokens(tp, tp.size * x.shape[0], f"{gemm_name} forward")

    def sequential() -> torch.Tensor:
        x_full = tp.all_gather_rows(x)
        return gemm(
            x_full,
            weight,
            transb=True,
            bias=bias,
            out_dtype=out_dtype,
            a_scale_inv=x_scale_inv,
            b_scale_inv=weight_scale_inv,
        )

    if overlap:
        name = f"{gemm_name}_fprop"

        def overlapped(op: Any) -> torch.Tensor:
            return op(
                _operand(x, x_scale_inv),
                _operand(weight, weight_scale_inv),
                bias=bias,
                out_dtype=out_dtype,
                keep_gathered=False,
            )

        shape = (tp.size * x.shape[0], x.shape[1], weight.shape[0])
        op = _planned_op(tp, name, shape, x, call=overlapped, run_sequential=sequential)
        if op is not None:
            return overlapped(op)
    return sequential()


column_forward = torch.library.custom_op(
    "overlap::column_forward", _column_forward, mutates_args=()
)


@column_forward.register_fake
def _(  # noqa: PLR0917
    x, x_scale_inv, weight, weight_scale_inv, bias, group_id, gemm_name, overlap, out_dtype
):
    tp = lookup_group(group_id)
    return x.new_empty((tp.size * x.shape[0], weight.shape[0]), dtype=out_dtype)


def _column_backward(  # noqa: PLR0917 (a schema is positional)
    dy: torch.Tensor,
    dy_scale_inv: torch.Tensor | None,
    dy_t: torch.Tensor | None,
    x: torch.Tensor,
    x_scale_inv: torch.Tensor | None,
    w_dgrad: torch.Tensor,
    w_dgrad_scale_inv: torch.Tensor | None,
    main_grad: torch.Tensor | None,
    group_id: int,
    gemm_name: str,
    bulk_dgrad: bool,
    bulk_wgrad: bool,
    rs_dgrad: bool,
    wgrad: bool,
    dx_dtype: torch.dtype,
    dw_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dX shard [m, K], dW [N, K])`` of ``Y = AllGather(x) W^T``.

    Operands: ``dy`` ``[T, N]`` (FP8: rowwise data; ``dy_t`` its ``[N, T]`` transpose for
    wgrad, same scale), the saved input shard ``x`` ``[m, K]``, and ``w_dgrad``: high
    precision ``W`` ``[N, K]`` (multiplied as it is), FP8 ``W^T`` ``[K, N]`` (the weight's
    columnwise data). ``main_grad``: accumulate ``dW`` into it (``dW`` is then empty).
    """
    tp = lookup_group(group_id)
    fp8 = dy_scale_inv is not None
    dgrad_kw = {
        "transb": fp8,
        "a_scale_inv": dy_scale_inv,
        "b_scale_inv": w_dgrad_scale_inv,
        "fast_accum": False,
    }
    dx: torch.Tensor | None = None
    dgrad: torch.Tensor | None = None
    # 1. The gathered input (wgrad reads it) and dgrad: dX partial [T, K] = dY W, every
    #    rank's partial sum over its slice of N.
    x_full_scale_inv = x_scale_inv
    dgrad_name = f"{gemm_name}_dgrad"
    # NOTE [shape plans]: each overlapped step may run its sequential twin instead; dgrad is
    # [T, N] x [N, K] (K: the dX width, w_dgrad's rows in FP8, its columns otherwise).
    dgrad_shape = (dy.shape[0], dy.shape[1], w_dgrad.shape[0 if fp8 else 1])

    def dgrad_gemm() -> torch.Tensor:
        return gemm(dy, w_dgrad, out_dtype=dx_dtype, **dgrad_kw)

    def gather_then_dgrad() -> tuple[torch.Tensor, torch.Tensor]:
        return tp.all_gather_rows(x), dgrad_gemm()

    op = None
    if bulk_dgrad:

        def bulk_ag(op: Any) -> torch.Tensor:
            return op(_operand(x, x_scale_inv), dy, w_dgrad, out_dtype=dx_dtype, **dgrad_kw)

        op = _planned_op(
            tp, dgrad_name, dgrad_shape, dy, call=bulk_ag, run_sequential=gather_then_dgrad
        )
    if op is not None:
        dgrad = bulk_ag(op)
        x_full, x_full_scale_inv = _kept_gather(op, x_scale_inv)
    else:
        x_full = tp.all_gather_rows(x)
        if rs_dgrad:

            def gemm_rs(op: Any) -> torch.Tensor:
                return op(
                    _operand(dy, dy_scale_inv),
                    _operand(w_dgrad, w_dgrad_scale_inv),
                    weight_layout="nk" if fp8 else "kn",
                    fast_accum=False,
                )

            def dgrad_then_scatter() -> torch.Tensor:
                return tp.reduce_scatter_rows(dgrad_gemm())

            op = _planned_op(
                tp, dgrad_name, dgrad_shape, dy, call=gemm_rs, run_sequential=dgrad_then_scatter
            )
            if op is not None:
                dx = gemm_rs(op)
        if dx is None:
            dgrad = dgrad_gemm()
    # 2. wgrad: dW [N, K] = dY^T X_full (FP8: TN, from the transposes [N, T] and [K, T]).
    empty = dy.new_empty((0,), dtype=dw_dtype)
    if fp8:
        w_a, w_b = dy_t, _transpose(x_full)
        w_kw = {"transb": True, "a_scale_inv": dy_scale_inv, "b_scale_inv": x_full_scale_inv}
    else:
        w_a, w_b = dy, x_full
        w_kw = {"transa": True}
    out_kw = {"gemm_out": main_grad, "beta": 1.0} if main_grad is not None else {}
    # 3. dX shard (the reduce-scatter of dgrad) and dW.
    op = None
    if dx is None and bulk_wgrad and wgrad:
        wgrad_name = f"{gemm_name}_wgrad"

        # Timed with a fresh dW: a timed call must not accumulate into main_grad.
        def bulk_rs(op: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return op(dgrad, w_a, w_b, fast_accum=False, gemm_out_dtype=dw_dtype, **w_kw)

        def scatter_then_wgrad() -> tuple[torch.Tensor, torch.Tensor]:
            return (
                tp.reduce_scatter_rows(dgrad),  # type: ignore[arg-type]
                gemm(w_a, w_b, out_dtype=dw_dtype, fast_accum=False, **w_kw),
            )

        # wgrad is [N, T] x [T, K]: N the rows of dW, K its columns.
        wgrad_shape = (dy.shape[1], dy.shape[0], x.shape[1])
        op = _planned_op(
            tp, wgrad_name, wgrad_shape, dy, call=bulk_rs, run_sequential=scatter_then_wgrad
        )
    if op is not None:
        if main_grad is None:
            out_kw = {"gemm_out_dtype": dw_dtype}
        dx, dw = op(dgrad, w_a, w_b, fast_accum=False, **out_kw, **w_kw)
    else:
        if dx is None:
            dx = tp.reduce_scatter_rows(dgrad)  # type: ignore[arg-type]
        dw = empty
        if wgrad and main_grad is not None:
            gemm(w_a, w_b, out=main_grad, beta=1.0, fast_accum=False, **w_kw)
        elif wgrad:
            dw = gemm(w_a, w_b, out_dtype=dw_dtype, fast_accum=False, **w_kw)
    if main_grad is not None or not wgrad:
        return dx, empty
    return dx, dw


column_backward = torch.library.custom_op(
    "overlap::column_backward", _column_backward, mutates_args=("main_grad",)
)


@column_backward.register_fake
def _(  # noqa: PLR0917
    dy,
    dy_scale_inv,
    dy_t,
    x,
    x_scale_inv,
    w_dgrad,
    w_dgrad_scale_inv,
    main_grad,
    group_id,
    gemm_name,
    bulk_dgrad,
    bulk_wgrad,
    rs_dgrad,
    wgrad,
    dx_dtype,
    dw_dtype,
):
    fp8 = dy_scale_inv is not None
    n = dy.shape[1]
    k = w_dgrad.shape[0] if fp8 else w_dgrad.shape[1]
    dx = dy.new_empty((x.shape[0], k), dtype=dx_dtype)
    shape = (n, k) if (wgrad and main_grad is None) else (0,)
    return dx, dy.new_empty(shape, dtype=dw_dtype)


# ---- row-parallel ------------------------------------------------------------------------------


def _row_forward(  # noqa: PLR0917 (a schema is positional)
    x: torch.Tensor,
    x_scale_inv: torch.Tensor | None,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor | None,
    group_id: int,
    gemm_name: str,
    overlap: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``Y shard [T/tp, N] = ReduceScatter(x [T, K] @ weight[N, K]^T)``."""
    tp = lookup_group(group_id)
    _check_tokens(tp, x.shape[0], f"{gemm_name} forward")
    if x.shape[0] % tp.size:
        from overlap.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{gemm_name} forward: {x.shape[0]} tokens do not split over the TP size "
            f"{tp.size}; the tokens of a row-parallel layer must be a multiple of it"
        )

    def sequential() -> torch.Tensor:
        partial = gemm(
            x,
            weight,
            transb=True,
            out_dtype=out_dtype,
            a_scale_inv=x_scale_inv,
            b_scale_inv=weight_scale_inv,
        )
        return tp.reduce_scatter_rows(partial)

    if overlap:
        name = f"{gemm_name}_fprop"
        op = tp.userbuffers(name).get(name)
        if op.out_dtype != out_dtype:
            from overlap.errors import ConfigError

            raise ConfigError(
                f"{name}: the userbuffers reduce-scatter {op.out_dtype} but the "
                f"layer outputs {out_dtype}; initialize_ub(dtype=...) must be the layer's "
                "activation dtype"
            )

        def overlapped(op: Any) -> torch.Tensor:
            return op(_operand(x, x_scale_inv), _operand(weight, weight_scale_inv))

        shape = (x.shape[0], x.shape[1], weight.shape[0])
        planned = _planned_op(tp, name, shape, x, call=overlapped, run_sequential=sequential)
        if planned is not None:
            return overlapped(planned)
    return sequential()


row_forward = torch.library.custom_op("overlap::row_forward", _row_forward, mutates_args=())


@row_forward.register_fake
def _(  # noqa: PLR0917
    x, x_scale_inv, weight, weight_scale_inv, group_id, gemm_name, overlap, out_dtype
):
    tp = lookup_group(group_id)
    return x.new_empty((x.shape[0] // tp.size, weight.shape[0]), dtype=out_dtype)


def _row_backward(  # noqa: PLR0917 (a schema is positional)
    dy: torch.Tensor,
    dy_scale_inv: torch.Tensor | None,
    x_wgrad: torch.Tensor,
    x_scale_inv: torch.Tensor | None,
    w_dgrad: torch.Tensor,
    w_dgrad_scale_inv: torch.Tensor | None,
    main_grad: torch.Tensor | None,
    group_id: int,
    gemm_name: str,
    overlap: bool,
    wgrad: bool,
    dx_dtype: torch.dtype,
    dw_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dX [T, K], dW [N, K])`` of ``Y = ReduceScatter(x W^T)``.

    Operands: ``dy`` the output gradient shard ``[T/tp, N]`` (FP8: data whose amax was
    reduced over the group, so the gathered dY has one scale), ``x_wgrad`` the input ``[T, K]``
    (FP8: its ``[K, T]`` transpose), ``w_dgrad`` ``W`` ``[N, K]`` (FP8: ``W^T`` ``[K, N]``).
    """
    tp = lookup_group(group_id)
    fp8 = dy_scale_inv is not None

    def sequential() -> tuple[torch.Tensor, torch.Tensor]:
        dy_full = tp.all_gather_rows(dy)
        dx = gemm(
            dy_full,
            w_dgrad,
            transb=fp8,
            a_scale_inv=dy_scale_inv,
            b_scale_inv=w_dgrad_scale_inv,
            out_dtype=dx_dtype,
            fast_accum=False,
        )
        return dy_full, dx

    op = None
    if overlap:
        name = f"{gemm_name}_dgrad"

        def overlapped(op: Any) -> torch.Tensor:
            return op(
                _operand(dy, dy_scale_inv),
                _operand(w_dgrad, w_dgrad_scale_inv),
                weight_layout="nk" if fp8 else "kn",
                out_dtype=dx_dtype,
                keep_gathered=True,
                fast_accum=False if fp8 else None,
            )

        # dgrad alone is timed (wgrad is the same GEMM either way, and may accumulate into
        # main_grad, which a timed call must not touch).
        shape = (tp.size * dy.shape[0], dy.shape[1], w_dgrad.shape[0 if fp8 else 1])
        op = _planned_op(tp, name, shape, dy, call=overlapped, run_sequential=sequential)
    if op is not None:
        dx = overlapped(op)
        dy_full, dy_scale_inv = _kept_gather(op, dy_scale_inv)
    else:
        dy_full, dx = sequential()
    empty = dy.new_empty((0,), dtype=dw_dtype)
    if not wgrad:
        return dx, empty
    if fp8:
        w_kw = {"transb": True, "a_scale_inv": dy_scale_inv, "b_scale_inv": x_scale_inv}
        w_a = _transpose(dy_full)  # [N, T]
    else:
        w_kw = {"transa": True}
        w_a = dy_full
    if main_grad is not None:
        gemm(w_a, x_wgrad, out=main_grad, beta=1.0, fast_accum=False, **w_kw)
        return dx, empty
    return dx, gemm(w_a, x_wgrad, out_dtype=dw_dtype, fast_accum=False, **w_kw)


row_backward = torch.library.custom_op(
    "overlap::row_backward", _row_backward, mutates_args=("main_grad",)
)


@row_backward.register_fake
def _(  # noqa: PLR0917
    dy,
    dy_scale_inv,
    x_wgrad,
    x_scale_inv,
    w_dgrad,
    w_dgrad_scale_inv,
    main_grad,
    group_id,
    gemm_name,
    overlap,
    wgrad,
    dx_dtype,
    dw_dtype,
):
    tp = lookup_group(group_id)
    fp8 = dy_scale_inv is not None
    tokens = dy.shape[0] * tp.size
    k = w_dgrad.shape[0] if fp8 else w_dgrad.shape[1]
    dx = dy.new_empty((tokens, k), dtype=dx_dtype)
    shape = (dy.shape[1], k) if (wgrad and main_grad is None) else (0,)
    return dx, dy.new_empty(shape, dtype=dw_dtype)


# ---- replicated parameters ---------------------------------------------------------------------


def _tp_all_reduce(x: torch.Tensor, group_id: int) -> torch.Tensor:
    """The sum over the TP group of ``x``: the gradient of a parameter every rank holds whole
    but applies to its own tokens only (norm weights, a row-parallel bias)."""
    return lookup_group(group_id).all_reduce_sum(x)


tp_all_reduce = torch.library.custom_op("overlap::tp_all_reduce", _tp_all_reduce, mutates_args=())


@tp_all_reduce.register_fake
def _(x, group_id):
    return torch.empty_like(x)


# ---- eager dispatch ----------------------------------------------------------------------------

# NOTE [eager dispatch]: outside a compiler's trace the layers call each op's Python function
# straight away: the torch.library dispatch (schema defaults, the autograd and ADInplaceOrView
# keys, the alias check of the outputs) costs tens of microseconds per call of these wide
# schemas, on the host, in every step, for nothing an eager caller needs (the layers' own
# autograd functions already handle autograd, and the outputs are new tensors). While
# torch.compile traces (dynamo, or a dispatch mode such as AOTAutograd's fake and proxy modes)
# the custom op runs, so the graph holds the opaque node. Verdict: eager skips the dispatcher,
# tracing never does.
_OPS = {
    "column_forward": (column_forward, _column_forward),
    "column_backward": (column_backward, _column_backward),
    "row_forward": (row_forward, _row_forward),
    "row_backward": (row_backward, _row_backward),
    "tp_all_reduce": (tp_all_reduce, _tp_all_reduce),
}


def _tracing() -> bool:
    """A compiler traces (dynamo), or a dispatch mode (fake, proxy, a user's) is active."""
    return torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0


def dispatch(name: str, *args: Any) -> Any:
    """Run the layer op ``name`` (NOTE [eager dispatch]): its custom op while tracing, its
    function directly otherwise."""
    op, fn = _OPS[name]
    return op(*args) if _tracing() else fn(*args)
