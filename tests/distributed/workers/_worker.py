"""Helpers shared by worker scripts (run as ``python workers/<name>.py`` under mpirun)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch


def run(main: Callable[[], None]) -> None:
    """Run ``main``; print ``PASS rank=<r>`` on success, abort the whole job on failure.

    Aborting matters: a rank that dies while its peers wait in a collective would otherwise
    leave them hanging until the launcher's timeout.
    """
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    try:
        main()
    except BaseException:
        print(f"FAIL rank={rank}\n{traceback.format_exc()}", flush=True)
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)
    MPI.COMM_WORLD.Barrier()
    _teardown_torch_distributed()
    print(f"PASS rank={rank}", flush=True)


def _teardown_torch_distributed() -> None:
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def device_for(transport: str, local_rank: int) -> torch.device:
    """The device of this rank: the CPU on the host transport; on cuda, the GPU of its local
    rank, made the current device."""
    import torch

    if transport != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


class Setup(NamedTuple):
    """What every worker's main() starts from: ``<scenario> <tp_size> [host|cuda]``."""

    scenario: str
    transport: str
    launch: Any  # overlap.launch.LaunchEnv
    device: Any  # torch.device of this rank
    tp: Any  # the TP group's TorchBootstrap


def setup(argv: list[str]) -> Setup:
    """Parse ``argv``, initialise torch.distributed (gloo) and this rank's device, and split
    the world into TP groups."""
    from overlap.comm import TorchBootstrap, tp_subgroup
    from overlap.launch import init_torch_distributed

    scenario, tp_size = argv[1], int(argv[2])
    transport = argv[3] if len(argv) > 3 else "host"
    launch = init_torch_distributed("gloo")
    device = device_for(transport, launch.local_rank)
    tp = tp_subgroup(TorchBootstrap(), tp_size)
    return Setup(scenario, transport, launch, device, tp)


def expect_raises(exc_type: type[BaseException], match: str, fn: Callable[[], object]) -> None:
    """Assert that ``fn()`` raises ``exc_type`` with ``match`` in its message."""
    try:
        fn()
    except exc_type as exc:
        assert match in str(exc), f"expected {match!r} in {exc!r}"
        return
    raise AssertionError(f"expected {exc_type.__name__} matching {match!r}, nothing raised")


def count_calls(module: Any, name: str) -> list[int]:
    """Wraps ``module.<name>`` (for the rest of the process) so that each call appends to the
    returned list: e.g. a function only an op's checked path calls (NOTE [op plans])."""
    real = getattr(module, name)
    calls: list[int] = []

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    setattr(module, name, counted)
    return calls


def same_error(planned: Callable[[], object], fresh: Callable[[], object]) -> None:
    """Both calls raise the same typed error with the same message (an op with a plan, and one
    without: NOTE [op plans])."""
    from overlap.errors import OverlapError

    errors = []
    for call in (planned, fresh):
        try:
            call()
        except OverlapError as exc:
            errors.append(exc)
        else:
            raise AssertionError("expected an OverlapError, nothing raised")
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1]), errors


def per_tensor_fp8(x: torch.Tensor, scale: float) -> Any:
    """``x`` as a per-tensor E4M3 :class:`~overlap.quantization.QuantizedTensor` (rowwise
    data, scaled by ``scale``), on ``x``'s device."""
    import torch

    from overlap.quantization import (
        DirectionFormat,
        Fp8Format,
        QuantizedTensor,
        ScalingMode,
        cast_to_fp8,
    )

    data, scale_inv = cast_to_fp8(
        x.float(), torch.tensor([scale], device=x.device), fp8_dtype=torch.float8_e4m3fn
    )
    return QuantizedTensor(
        shape=tuple(x.shape),
        dtype=torch.bfloat16,
        rowwise_format=DirectionFormat(ScalingMode.TENSOR, Fp8Format.E4M3),
        columnwise_format=DirectionFormat(),
        rowwise_data=data,
        rowwise_scale_inv=scale_inv,
    )


def close(
    got: torch.Tensor, want: torch.Tensor, what: str, *, cuda: bool, fp8_inputs: bool = False
) -> None:
    """An op's GEMM output against its reference: bit-exact on the host (its GEMM is the
    float64-accurate reference, whatever the chunking); on cuda within bfloat16 tolerance
    (2e-2 for FP8 inputs) relative to the largest value, as cuBLASLt (or the waiting GEMM) may
    pick other kernels for chunks than for the whole matrix; FP8 outputs within one code."""
    import torch

    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    g, w = got.float().cpu(), want.float().cpu()
    assert torch.isfinite(g).all(), f"{what}: non-finite values (poison left?)"
    if not cuda:
        assert torch.equal(g, w), f"{what}: max |diff| {(g - w).abs().max()}"
        return
    if got.dtype == torch.float8_e4m3fn:  # chunked and whole GEMMs may round one code apart
        ulp = torch.maximum(g.abs(), w.abs()) * 2.0**-3 + 2.0**-9
        assert ((g - w).abs() <= ulp).all(), f"{what}: FP8 codes more than one step apart"
        return
    tol = 2e-2 if fp8_inputs else 1e-2
    err = ((g - w).abs().max() / w.abs().max().clamp_min(1e-6)).item()
    assert err <= tol, f"{what}: relative error {err} > {tol}"


def close_ring(
    got: torch.Tensor, want: torch.Tensor, what: str, n: int, roundoff: float, *, cuda: bool
) -> None:
    """A ring GEMM+RS against the reference. The ring rounds its running sum to the partial
    dtype (unit roundoff ``roundoff``) at each of its n hops, the reference rounds each of the
    n partial sums and then their sum: at most 2 (n + 1) roundings apart, relative to the
    largest value (NOTE [gemm_rs_ring numerics]). On cuda the GEMM's own tolerance (2e-2) is
    added. FP8 outputs may also round to a neighbouring code."""
    import torch

    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    g, w = got.float().cpu(), want.float().cpu()
    assert torch.isfinite(g).all(), f"{what}: non-finite values (poison left?)"
    tol = 2 * (n + 1) * roundoff + (2e-2 if cuda else 0.0)
    bound = tol * w.abs().max().clamp_min(1e-6)
    if got.dtype == torch.float8_e4m3fn:  # plus one FP8 step of either value
        bound = bound + torch.maximum(g.abs(), w.abs()) * 2.0**-3 + 2.0**-9
    err = (g - w).abs()
    assert (err <= bound).all(), f"{what}: |diff| {err.max()} beyond the ring's rounding bound"


def local_setup() -> Any:
    """For workers launched by ``launcher.run_local_ranks`` (plain processes, no mpirun):
    initialise torch.distributed (gloo) through the launch's FileStore; returns the world's
    TorchBootstrap."""
    import datetime
    import os

    import torch.distributed as dist

    from overlap.comm import TorchBootstrap

    rank = int(os.environ["TEST_LOCAL_RANK"])
    size = int(os.environ["TEST_LOCAL_SIZE"])
    store = dist.FileStore(os.environ["TEST_LOCAL_STORE"], size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=60)
    )
    return TorchBootstrap()


def run_local(main: Callable[[], None]) -> None:
    """``run`` for workers of ``launcher.run_local_ranks``: prints ``PASS rank=<r>`` and ends
    the process at once (``os._exit``: a peer may have died, and gloo's teardown would wait
    for it), or prints the failure and exits 1."""
    import os

    rank = int(os.environ["TEST_LOCAL_RANK"])
    try:
        main()
    except BaseException:
        print(f"FAIL rank={rank}\n{traceback.format_exc()}", flush=True)
        sys.stdout.flush()
        os._exit(1)
    print(f"PASS rank={rank}", flush=True)
    sys.stdout.flush()
    os._exit(0)
