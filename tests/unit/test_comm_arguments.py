"""Issue 32, item 8: wrong-type arguments to overlap.comm raise the library's typed errors (not
a bare TypeError, AttributeError or ValueError), and the gathers take tensors of any dtype
(NOTE [gather dtypes] in csrc/bindings/tensor_arg.h)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from overlap.comm import Communicator, MPIBootstrap, SymmetricBuffer, check_single_host, tp_subgroup
from overlap.errors import ConfigError, InvalidArgumentError, StateError
from tests.unit.local_group import on_every_rank
from tests.unit.test_comm_fail_safe import OneRank


@pytest.fixture(scope="module")
def buf() -> SymmetricBuffer:
    return Communicator(OneRank(), "host").create_buffer(4096)


X = torch.ones(4)
CASES: dict[str, tuple[type[Exception], Callable[[SymmetricBuffer], object]]] = {
    "Communicator(None)": (ConfigError, lambda b: Communicator(None)),  # type: ignore[arg-type]
    "Communicator(transport=5)": (ConfigError, lambda b: Communicator(OneRank(), 5)),  # type: ignore[arg-type]
    "Communicator(timeout_s='abc')": (
        ConfigError,
        lambda b: Communicator(OneRank(), timeout_s="abc"),  # type: ignore[arg-type]
    ),
    "create_buffer(name=5)": (
        InvalidArgumentError,
        lambda b: Communicator(OneRank()).create_buffer(64, name=5),  # type: ignore[arg-type]
    ),
    "view(None, ...)": (InvalidArgumentError, lambda b: b.view(None, (4,))),  # type: ignore[arg-type]
    "view(dtype='no_such')": (InvalidArgumentError, lambda b: b.view("no_such", (4,))),  # type: ignore[arg-type]
    "view(shape='ab')": (InvalidArgumentError, lambda b: b.view(torch.float32, "ab")),  # type: ignore[arg-type]
    "view(shape=None)": (InvalidArgumentError, lambda b: b.view(torch.float32, None)),  # type: ignore[arg-type]
    "view(offset=-4)": (InvalidArgumentError, lambda b: b.view(torch.float32, (4,), offset=-4)),
    "view(offset='4')": (
        InvalidArgumentError,
        lambda b: b.view(torch.float32, (4,), offset="4"),  # type: ignore[arg-type]
    ),
    "view(offset=4.0)": (
        InvalidArgumentError,
        lambda b: b.view(torch.float32, (4,), offset=4.0),  # type: ignore[arg-type]
    ),
    "view(peer='0')": (InvalidArgumentError, lambda b: b.view(torch.float32, (4,), peer="0")),  # type: ignore[arg-type]
    "all_gather(x, output=5)": (InvalidArgumentError, lambda b: b.all_gather(X, 5)),  # type: ignore[arg-type]
    "all_gather_into([(x, 'a')])": (InvalidArgumentError, lambda b: b.all_gather_into([(X, "a")])),  # type: ignore[list-item]
    "all_gather_into([x])": (InvalidArgumentError, lambda b: b.all_gather_into([X])),  # type: ignore[list-item]
    "all_gather_into([(x, -4)])": (InvalidArgumentError, lambda b: b.all_gather_into([(X, -4)])),
    "all_gather_into([(None, 0)])": (
        InvalidArgumentError,
        lambda b: b.all_gather_into([(None, 0)]),  # type: ignore[list-item]
    ),
    "reduce_scatter(None)": (InvalidArgumentError, lambda b: b.reduce_scatter(None)),  # type: ignore[arg-type]
    "reduce_scatter([1.0])": (InvalidArgumentError, lambda b: b.reduce_scatter([1.0])),  # type: ignore[arg-type]
    "reduce_scatter(x, output=5)": (InvalidArgumentError, lambda b: b.reduce_scatter(X, 5)),  # type: ignore[arg-type]
    "put_split='a'": (ConfigError, lambda b: setattr(b, "put_split", "a")),
    "put_split=None": (ConfigError, lambda b: setattr(b, "put_split", None)),
    "put_split=2.5": (ConfigError, lambda b: setattr(b, "put_split", 2.5)),
    "pull_gather='no'": (ConfigError, lambda b: setattr(b, "pull_gather", "no")),
    "serial_puts=None": (ConfigError, lambda b: setattr(b, "serial_puts", None)),
    "sm_share=5": (ConfigError, lambda b: setattr(b, "sm_share", 5)),
    "sm_share=('a', 1)": (ConfigError, lambda b: setattr(b, "sm_share", ("a", 1))),
    "sm_share=(1, 2, 3)": (ConfigError, lambda b: setattr(b, "sm_share", (1, 2, 3))),
    "overlaps(None)": (InvalidArgumentError, lambda b: b.overlaps(None)),  # type: ignore[arg-type]
    "check_current('a', ...)": (
        InvalidArgumentError,
        lambda b: b.check_current("a", "reader"),  # type: ignore[arg-type]
    ),
    "tp_subgroup(world, 'a')": (ConfigError, lambda b: tp_subgroup(OneRank(), "a")),  # type: ignore[arg-type]
    "tp_subgroup(None, 1)": (ConfigError, lambda b: tp_subgroup(None, 1)),  # type: ignore[arg-type]
    "check_single_host(None)": (ConfigError, lambda b: check_single_host(None)),  # type: ignore[arg-type]
    "broadcast_bytes(root='a')": (
        ConfigError,
        lambda b: OneRank().broadcast_bytes(b"x", root="a"),  # type: ignore[arg-type]
    ),
    "MPIBootstrap(5)": (ConfigError, lambda b: MPIBootstrap(5)),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_wrong_types_raise_typed_errors(buf: SymmetricBuffer, case: str) -> None:
    cls, call = CASES[case]
    with pytest.raises(cls) as info:
        call(buf)
    assert type(info.value) is cls, repr(info.value)
    # Nothing was communicated, so nothing failed: the buffer still works.
    assert torch.equal(buf.all_gather(X), X)


def test_view_takes_a_dtype_name_and_an_int_shape(buf: SymmetricBuffer) -> None:
    buf.all_gather(torch.arange(8, dtype=torch.float32))
    assert torch.equal(buf.view("float32", 8), torch.arange(8, dtype=torch.float32))
    assert buf.view("torch.bfloat16", (2, 2)).dtype == torch.bfloat16


ANY_DTYPES = [torch.int64, torch.int8, torch.bool, torch.complex64, torch.float64, torch.int16]


def _sample(dtype: torch.dtype, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    if dtype == torch.bool:
        return torch.rand(3, 5, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(3, 5, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(3, 5, generator=g).to(dtype)
    return torch.randint(-100, 100, (3, 5), generator=g).to(dtype)


@pytest.mark.parametrize("dtype", ANY_DTYPES, ids=str)
def test_all_gather_takes_any_dtype(dtype: torch.dtype) -> None:
    """all_gather is documented for any dtype; int64, int8, bool and complex64 were refused."""

    def run(group: object) -> tuple[torch.Tensor, torch.Tensor]:
        comm = Communicator(group, "host", timeout_s=30)  # type: ignore[arg-type]
        b = comm.create_buffer(4096)
        mine = _sample(dtype, comm.group.rank)
        got = b.all_gather(mine)
        b.all_gather_into([(mine, 1024)])
        parts = b.view(dtype, (2 * 3, 5), offset=1024).clone()
        comm.destroy()
        return got, parts

    want = torch.cat([_sample(dtype, 0), _sample(dtype, 1)])
    for got, parts in on_every_rank(2, run):
        assert got.dtype == dtype and torch.equal(got, want)
        assert torch.equal(parts, want)


def test_ranks_gathering_different_dtypes_of_one_size_get_a_mismatch() -> None:
    """The dtype is part of the op record, also for the dtypes the core does not name."""

    def run(group: object) -> str:
        comm = Communicator(group, "host", timeout_s=30)  # type: ignore[arg-type]
        b = comm.create_buffer(4096)
        x = torch.ones(4, dtype=torch.int64 if comm.group.rank == 0 else torch.float64)
        try:
            b.all_gather(x)
        except StateError as exc:
            return str(exc)
        finally:
            comm.destroy()
        return "no error"

    for message in on_every_rank(2, run):
        assert "different sizes, dtypes or settings" in message, message
