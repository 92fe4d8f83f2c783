"""The overlap ops benchmark's runner (:mod:`benchmarks.overlap_ops`): every measurement of
one row of the suite, on every rank, and the sweep over the rows.

Per row (:func:`bench_row`, COLLECTIVE over the world: all TP groups run it at once): the
operands, the baselines (``T_gemm`` whole and chunked, ``T_comm``, ``T_seq``), our collective
alone (``T_comm_ours``, NOTE [pipeline floor]), the GEMM beside our copies (``T_concurrent``,
NOTE [concurrent floor]), every applicable variant of :mod:`benchmarks.methods` and torch's
async-TP op (or NCCL on a side stream for the bulk rows), all timed in passes (NOTE [timing
passes] in benchmarks/common.py); the metrics of :mod:`benchmarks.overlap_report` are added
to the row. The NOTEs are in benchmarks/overlap_ops.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import Progress, describe, first_error, time_in_passes
from benchmarks.methods import (
    BULK_OPS,
    Case,
    SideGemm,
    Variant,
    ub_alternate_variants,
    ub_default_variant,
)
from benchmarks.overlap_report import add_metrics, progress_message
from benchmarks.overlap_suite import te_floor_reference, te_reference
from benchmarks.trace import Tracer, row_label
from overlap.comm import Communicator, TorchBootstrap, TransportKind, tp_subgroup
from overlap.gemm import gemm, waiting_kernel_choices
from overlap.ops import all_gather_rows, gemm_reduce_scatter_reference
from overlap.quantization import CurrentScalingConfig, QuantizedTensor, make_quantizer
from overlap.ub.plans import OP, SEQUENTIAL, PlanPolicy, ShapeKey, ShapePlans


def operand(
    x: torch.Tensor, fp8: bool, amax_group: object = None
) -> torch.Tensor | QuantizedTensor:
    """``x`` as it enters the op: bf16, or per-tensor FP8 (current scaling; with an
    ``amax_group`` all its ranks share one scale, as sequence-parallel shards do)."""
    if not fp8:
        return x
    quantizer = make_quantizer(CurrentScalingConfig(), columnwise=False)
    return quantizer.quantize(x, amax_group=amax_group)


def data_of(x: torch.Tensor | QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(x, QuantizedTensor):
        return x.rowwise_data, x.rowwise_scale_inv
    return x, None


def gemm_calls(a, w, tp: int) -> dict[str, Callable[[], object]]:
    """The whole GEMM ``a @ w.T`` (``T_gemm_whole``) and the same as ``tp`` row chunks into one
    output (``T_gemm_chunked``)."""
    ad, asi = data_of(a)
    wd, wsi = data_of(w)
    out = torch.empty((ad.shape[0], wd.shape[0]), dtype=torch.bfloat16, device=ad.device)
    kw = {"transb": True, "a_scale_inv": asi, "b_scale_inv": wsi, "out": out}
    m = ad.shape[0] // tp

    def chunked() -> None:
        for j in range(tp):
            gemm(ad[j * m : (j + 1) * m], wd, row_offset=j * m, **kw)

    return {"T_gemm_whole": lambda: gemm(ad, wd, **kw), "T_gemm_chunked": chunked}


def sequential_ag_gemm(a, w, group: Any, out: torch.Tensor) -> torch.Tensor:
    """T_seq of AG+GEMM: the all-gather (NCCL / gloo), then one GEMM. The shards share one
    scale_inv (quantized with the group's amax), so unlike the reference op this needs no
    check of the gathered scales (a host synchronisation)."""
    ad, asi = data_of(a)
    wd, wsi = data_of(w)
    gathered = all_gather_rows(ad, group)
    return gemm(gathered, wd, transb=True, a_scale_inv=asi, b_scale_inv=wsi, out=out)


def side_gemm_call(side: SideGemm) -> Callable[[], object]:
    """The bulk row's GEMM alone: ``side.out = side.a @ side.b.T``."""
    ad, asi = data_of(side.a)
    bd, bsi = data_of(side.b)
    return lambda: gemm(ad, bd, transb=True, a_scale_inv=asi, b_scale_inv=bsi, out=side.out)


def side_stream_overlap(
    collective: Callable[[], object], side_gemm: Callable[[], object]
) -> Callable[[], None]:
    """What plain PyTorch overlaps a bulk row with: the (NCCL) collective issued on a side
    stream that waits for the current one, the GEMM on the current stream, then joined."""
    side = torch.cuda.Stream()

    def run() -> None:
        current = torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            collective()
        side_gemm()
        current.wait_stream(side)

    return run


def concurrently(
    collective: Callable[[], object], gemm_call: Callable[[], object], cuda: bool
) -> Callable[[], None]:
    """``collective`` and ``gemm_call`` with no dependency between them (NOTE [concurrent
    floor]): on a side stream beside the current one on GPUs, one after the other on the
    host transport."""
    if cuda:
        return side_stream_overlap(collective, gemm_call)

    def run() -> None:
        collective()
        gemm_call()

    return run


def torch_async_tp(op: str, a, w, group_name: str) -> tuple[str, Callable[[], object]]:
    """(name, call) of torch's fused op for this row; the caller reports "n/a" when it
    raises (a missing op, an unsupported dtype or layout, symmetric memory unavailable)."""
    sm = torch.ops.symm_mem
    ad, asi = data_of(a)
    wd, wsi = data_of(w)
    fp8 = asi is not None
    if op == "ag_gemm":
        if fp8:
            return "fused_all_gather_scaled_matmul", lambda: sm.fused_all_gather_scaled_matmul(
                ad, [wd.t()], asi, [wsi], 0, group_name, [None], [None], [torch.bfloat16], [True]
            )
        # Without return_A (where torch has it) torch does not copy the gathered input out;
        # nor do our AG+GEMM variants (keep_gathered=False, the op's default).
        schema = sm.fused_all_gather_matmul.default._schema
        has_return_a = any(arg.name == "return_A" for arg in schema.arguments)
        kw = {"return_A": False} if has_return_a else {}
        return "fused_all_gather_matmul", lambda: sm.fused_all_gather_matmul(
            ad, [wd.t()], 0, group_name, **kw
        )
    if fp8:
        shape = [ad.shape[0], wd.shape[0]]
        return "fused_scaled_matmul_reduce_scatter", lambda: sm.fused_scaled_matmul_reduce_scatter(
            ad, wd.t(), asi, wsi, "sum", 0, 0, group_name, shape, None, None, torch.bfloat16, True
        )
    return "fused_matmul_reduce_scatter", lambda: sm.fused_matmul_reduce_scatter(
        ad, wd.t(), "sum", 0, group_name
    )


def build_variants(
    case: Case, variants: Sequence[Variant]
) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """(call by variant name, error by variant name) of the variants that apply to ``case``.

    A variant whose builder raises on any rank is reported with the error and skipped by all
    ranks; the objects the builders keep live until ``case.release()``."""
    calls: dict[str, Callable[[], object]] = {}
    errors: dict[str, str] = {}
    for v in variants:
        if not v.applies(case):
            continue
        run, error = None, None
        try:
            run = v.make(case)
        except Exception as exc:  # reported as n/a (after every rank agreed)
            error = describe(exc)
        error = first_error(error)
        if error is not None:
            errors[v.name] = error
            continue
        calls[v.name] = run
    return calls, errors


@dataclass(frozen=True)
class RowRun:
    """What every row runs with: the TP group (communicator and ProcessGroup), the variants,
    the transport and the timer (``timer(call, host)``: ms of a callable, max over ranks; on
    GPUs it appends the host's enqueue ms per call, max over ranks, to the list ``host``)."""

    comm: Communicator
    group: Any
    variants: Sequence[Variant]
    cuda: bool
    timer: Callable[[Callable[[], object], list[float]], float]
    passes: int = 1
    tracer: Tracer | None = None


def bench_row(
    row: dict[str, Any],
    comm: Communicator,
    group: Any,
    variants: Sequence[Variant],
    *,
    cuda: bool,
    timer: Callable[[Callable[[], object], list[float]], float],
    passes: int = 1,
    tracer: Tracer | None = None,
) -> dict[str, Any]:
    """Every time of one row (COLLECTIVE over the world: all TP groups run it at once), each
    the median over ``passes`` passes (NOTE [timing passes]); with a ``tracer``, the GPU
    timelines of the best variant and torch's op as well (``row["trace"]``)."""
    run = RowRun(comm, group, variants, cuda, timer, passes, tracer)
    times = _bench_bulk_row if row["op"] in BULK_OPS else _bench_overlap_row
    out = dict(row)
    # a broad row's shape is <family>.<layer>: its layer names the GEMM (NOTE [broad suite])
    layer = row.get("layer") or row["shape"]
    out["default_variant"] = ub_default_variant(row["op"], layer, comm.group.size)
    out["alternate_variants"] = ub_alternate_variants(row["op"], layer, comm.group.size)
    out = times(out, run, *_row_inputs(cuda))
    return add_metrics(out)


def _bench_overlap_row(
    out: dict[str, Any], run: RowRun, device: torch.device, randn: Callable[..., torch.Tensor]
) -> dict[str, Any]:
    """The times of an AG+GEMM or GEMM+RS row, added to ``out`` (the row)."""
    comm, group, cuda = run.comm, run.group, run.cuda
    tp, fp8, m_all, k, n = _row_shape(out, comm)
    w = operand(randn(n, k) * 0.05, fp8)
    if out["op"] == "ag_gemm":
        a = operand(randn(m_all // tp, k), fp8, amax_group=group)
        calls = gemm_calls(operand(randn(m_all, k), fp8), w, tp)
        calls["T_comm"] = lambda: all_gather_rows(data_of(a)[0], group)
        y = torch.empty((m_all, n), dtype=torch.bfloat16, device=device)
        y_seq = torch.empty_like(y)
        calls["T_seq"] = lambda: sequential_ag_gemm(a, w, group, y_seq)
    else:
        a = operand(randn(m_all, k), fp8)
        calls = gemm_calls(a, w, tp)
        partial = randn(m_all, n)
        y = torch.empty((m_all // tp, n), dtype=torch.bfloat16, device=device)
        if cuda:
            calls["T_comm"] = lambda: dist.reduce_scatter_tensor(y, partial, group=group)
        else:  # gloo has no reduce-scatter: the all-gather the exact reference sums after
            calls["T_comm"] = lambda: all_gather_rows(partial.unsqueeze(0), group)
        calls["T_seq"] = lambda: gemm_reduce_scatter_reference(a, w, group=group, exact=not cuda)
    torch_call = None
    if not cuda:
        out["torch_error"] = "needs CUDA symmetric memory (host transport)"
    else:
        try:
            out["torch_op"], torch_call = torch_async_tp(out["op"], a, w, group.group_name)
            torch_call()  # raises here where torch's op does not apply
        except Exception as exc:  # any failure of torch's op is reported as n/a
            out["torch_error"], torch_call = describe(exc), None
    case = Case(out["op"], comm, m_all, k, n, a, w, y, fp8, cuda, group=group)
    if out["op"] == "ag_gemm":
        calls["T_comm_ours"] = moved = _our_all_gather(case, data_of(a)[0])
    else:
        calls["T_comm_ours"] = _our_reduce_scatter(case, partial)
        # NOTE [concurrent floor]: the bytes the reduce-scatter pulls, without its reduction
        moved = _our_all_gather(case, partial[: m_all // tp], key="moved")
    for form in ("whole", "chunked"):  # NOTE [concurrent floor]
        calls[f"T_concurrent_{form}"] = concurrently(moved, calls[f"T_gemm_{form}"], cuda)
    _time_row(out, run, case, calls, torch_call)
    out["T_gemm"] = min(out["T_gemm_whole"], out["T_gemm_chunked"])
    out["T_concurrent"] = min(out["T_concurrent_whole"], out["T_concurrent_chunked"])
    te = te_reference(out, cuda)
    out["T_te_ref"], out["te_ref_method"] = te if te else (None, None)
    out["te_ref_floor"] = te_floor_reference(out, cuda)
    return out


def _our_all_gather(
    case: Case, shard: torch.Tensor, key: str = "comm_ours"
) -> Callable[[], object]:
    """Our runtime's all-gather of ``shard`` alone (NOTE [pipeline floor]), on a buffer of its
    own (``case.keep`` under ``key``) that lives as long as the row's variants (COLLECTIVE)."""
    buf = case.keep((key,), lambda: case.comm.create_buffer(shard.nbytes * case.tp))
    return lambda: buf.all_gather_into([(shard, 0)])


def _our_reduce_scatter(case: Case, partial: torch.Tensor) -> Callable[[], object]:
    """Our runtime's reduce-scatter alone (NOTE [pipeline floor]) of ``partial`` ``[M, N]``,
    in place in a buffer of its own, where a GEMM+RS's GEMMs leave their partial sums."""
    buf = case.keep(("comm_ours",), lambda: case.comm.create_buffer(partial.nbytes))
    sums = buf.view(partial.dtype, partial.shape)
    sums.copy_(partial)
    out = partial.new_empty((partial.shape[0] // case.tp, *partial.shape[1:]))
    buf.barrier()  # every rank's partial sums are in place before a peer reads them
    return lambda: buf.reduce_scatter(sums, out)


def _time_row(
    out: dict[str, Any],
    run: RowRun,
    case: Case,
    calls: dict[str, Callable[[], object]],
    torch_call: Callable[[], object] | None,
) -> None:
    """Builds the row's variants, then times ``calls`` (into ``out`` under their names), every
    variant (``T_ours_by_variant``) and ``torch_call`` (``T_torch``; None: not timed) in
    passes (NOTE [timing passes]; each pass's times in ``pass_times``), with the host's
    enqueue time per call of each variant and of torch's op where the timer measures it
    (``host_ms_by_variant``, ``host_ms_torch``: medians over the passes); with the run's
    tracer, traces the fastest variant and ``torch_call`` (``trace``); with the fused AG+GEMM
    on GPUs, the waiting kernels it chose for the row (``waiting_kernels``, NOTE [waiting gemm
    choice]); releases the case's objects."""
    chosen_before = {c["problem"] for c in waiting_kernel_choices()}
    try:
        built, out["variant_errors"] = build_variants(case, run.variants)
        out["plan"] = _plan(out, run, case, built, calls)
        timed = {**calls, **{f"variant {name}": call for name, call in built.items()}}
        if torch_call is not None:
            timed["T_torch"] = torch_call
        out["pass_times"] = {}
        host: dict[str, list[float]] = {name: [] for name in timed}
        times = time_in_passes(
            {name: name for name in timed},  # the timer looks the call up by its name
            lambda name: run.timer(timed[name], host[name]),
            run.passes,
            out["pass_times"],
        )
        if run.tracer is not None:
            traced = {}
            if built:
                best = min(built, key=lambda name: times[f"variant {name}"])
                traced[f"ours {best}"] = built[best]
            if torch_call is not None:
                traced[f"torch {out['torch_op']}"] = torch_call
            out["trace"] = run.tracer.record(row_label(out), traced)
    finally:
        case.release()
    out.update({name: times[name] for name in calls})
    out["T_ours_by_variant"] = {name: times[f"variant {name}"] for name in built}
    out["T_torch"] = times.get("T_torch")
    med = {name: statistics.median(ms) for name, ms in host.items() if ms}
    out["host_ms_by_variant"] = {
        name: med[f"variant {name}"] for name in built if f"variant {name}" in med
    }
    out["host_ms_torch"] = med.get("T_torch")
    chosen = [c for c in waiting_kernel_choices() if c["problem"] not in chosen_before]
    if chosen:
        out["waiting_kernels"] = chosen


def _plan(
    out: dict[str, Any],
    run: RowRun,
    case: Case,
    built: dict[str, Callable[[], object]],
    calls: dict[str, Callable[[], object]],
) -> dict[str, Any] | None:
    """NOTE [planned column]: what ``initialize_ub``'s measured shape plans (its default on
    GPUs, NOTE [shape plans] in overlap/ub/plans.py) would run for this row, decided by their
    own code and timing among the default variant, the variants of its alternate settings that
    were built (``alternate_variants``, NOTE [plan alternates] in overlap/ub/config.py) and
    ``T_seq``: ``{"path": the plan's label, "variant": the variant it runs (None:
    sequential), "overlap", "times_ms" (the plan's own figures by label, max over the TP
    group), "op_ms", "sequential_ms"}``; None where the default variant was not built
    (``--methods`` left it out). COLLECTIVE over the TP group."""
    default = out.get("default_variant")
    if default not in built:
        return None
    device = torch.device("cuda", torch.cuda.current_device()) if run.cuda else torch.device("cpu")

    def reduce_max(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=run.group)
        return [float(v) for v in t.tolist()]

    def barrier() -> None:  # device-side: queued on the stream, not waited for
        dist.all_reduce(torch.zeros(1, device=device), group=run.group)

    variants = {OP: default}
    for label, name in (out.get("alternate_variants") or {}).items():
        if name in built and name not in variants.values():
            variants[label] = name
    paths = {label: built[name] for label, name in variants.items()}
    paths[SEQUENTIAL] = calls["T_seq"]
    plans = ShapePlans(PlanPolicy.MEASURED)
    key = ShapeKey(f"{out['op']}:{out['shape']}", case.m, case.k, case.n, case.fp8)
    path = plans.choose(key, paths, reduce_max, cuda=run.cuda, barrier=barrier)
    plan = plans.plans()[0]
    return {
        "path": path,
        "variant": variants.get(path),
        "overlap": plan.overlap,
        "times_ms": dict(plan.times_ms),
        "op_ms": plan.op_ms,
        "sequential_ms": plan.sequential_ms,
    }


def _row_shape(row: dict[str, Any], comm: Communicator) -> tuple[int, bool, int, int, int]:
    """(tp, fp8, M, K, N) of a row."""
    return comm.group.size, row["dtype"] == "fp8", row["M"], row["K"], row["N"]


def _row_inputs(cuda: bool) -> tuple[torch.device, Callable[..., torch.Tensor]]:
    """(device, randn) for one row: ``randn(*shape)`` gives bfloat16 normal values from a
    generator seeded per rank (every row starts from the same seed)."""
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    gen = torch.Generator(device=device).manual_seed(1 + dist.get_rank())

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    return device, randn


def _bench_bulk_row(
    out: dict[str, Any], run: RowRun, device: torch.device, randn: Callable[..., torch.Tensor]
) -> dict[str, Any]:
    """The times of a bulk row (NOTE [bulk rows]), added to ``out`` (the row)."""
    comm, group, cuda = run.comm, run.group, run.cuda
    tp, fp8, m_all, k, n = _row_shape(out, comm)
    y = None
    if out["op"] == "bulk_ag":  # gather wgrad's input while dgrad runs
        a = operand(randn(m_all // tp, k), fp8, amax_group=group)
        side = SideGemm(
            operand(randn(m_all, n), fp8),
            operand(randn(k, n) * 0.05, fp8),
            torch.empty((m_all, k), dtype=torch.bfloat16, device=device),
        )

        def collective() -> object:
            return all_gather_rows(data_of(a)[0], group)

    else:  # reduce-scatter dgrad's partial sums while wgrad runs
        a = randn(m_all, k)
        y = torch.empty((m_all // tp, k), dtype=torch.bfloat16, device=device)
        side = SideGemm(
            operand(randn(n, m_all), fp8),
            operand(randn(k, m_all) * 0.05, fp8),
            torch.empty((n, k), dtype=torch.bfloat16, device=device),
        )

        def collective() -> object:
            if cuda:
                return dist.reduce_scatter_tensor(y, a, group=group)
            return all_gather_rows(a.unsqueeze(0), group)  # gloo has no reduce-scatter

    side_gemm = side_gemm_call(side)

    def sequential() -> None:
        collective()
        side_gemm()

    calls = {"T_gemm": side_gemm, "T_comm": collective, "T_seq": sequential}
    torch_call = None
    if cuda:
        out["torch_op"] = "nccl_side_stream"
        torch_call = side_stream_overlap(collective, side_gemm)
    else:
        out["torch_error"] = "the NCCL side-stream baseline needs CUDA"
    case = Case(out["op"], comm, m_all, k, n, a, None, y, fp8, cuda, group=group, side=side)
    _time_row(out, run, case, calls, torch_call)
    out["T_gemm_whole"], out["T_gemm_chunked"] = out["T_gemm"], None
    out["T_te_ref"], out["te_ref_method"], out["te_ref_floor"] = None, None, None
    return out


def run_suite(
    rows: Sequence[dict[str, Any]],
    variants: Sequence[Variant],
    *,
    cuda: bool,
    timer: Callable[[Callable[[], object], list[float]], float],
    passes: int = 1,
    tracer: Tracer | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Every row of ``rows`` (grouped by TP size, :func:`benchmarks.overlap_suite.build_suite`)
    through :func:`bench_row`, in order; COLLECTIVE over the world. One communicator per TP
    size: TP groups of contiguous ranks, all of which run every row at once (NOTE [TP below
    the world size]); a progress step per row."""
    kind = TransportKind.CUDA if cuda else TransportKind.HOST
    world = TorchBootstrap()
    results = []
    for tp in dict.fromkeys(r["tp"] for r in rows):  # in order, each TP size once
        # NOTE [TP below the world size]: every TP group runs every row at the same time.
        boot = world if tp == world.size else tp_subgroup(world, tp)
        comm = Communicator(boot, kind)
        if cuda:
            enable_torch_symm_mem(boot.group)
        try:
            for row in (r for r in rows if r["tp"] == tp):
                res = bench_row(
                    row,
                    comm,
                    boot.group,
                    variants,
                    cuda=cuda,
                    timer=timer,
                    passes=passes,
                    tracer=tracer,
                )
                results.append(res)
                if progress is not None:
                    progress.step(progress_message(res))
        finally:
            comm.destroy()
    return results


def enable_torch_symm_mem(group: Any) -> None:
    """Older torch needs this before its fused ops; newer torch deprecates it (no-op)."""
    import warnings

    try:
        from torch.distributed import _symmetric_memory as symm_mem

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group.group_name)
    except Exception as exc:  # torch's async-TP is then reported as n/a
        print(f"[overlap_ops] torch symmetric memory unavailable: {exc}", flush=True)
