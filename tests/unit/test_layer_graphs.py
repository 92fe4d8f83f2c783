"""make_graphed_callables' argument checks (NOTE [graphed layers]): typed errors before any
GPU work. The graphs themselves need GPUs: tests/distributed/test_layer_graphs.py."""

from __future__ import annotations

import pytest
import torch

from overlap.errors import ConfigError, InvalidArgumentError, UnsupportedHardwareError
from overlap.layers import make_graphed_callables


def _module() -> torch.nn.Module:
    return torch.nn.Linear(4, 4)


@pytest.mark.parametrize(
    ("modules", "args", "kw", "err", "match"),
    [
        (_module, lambda: (torch.ones(2, 4),), {"num_warmup_iters": 0}, ConfigError,
         "num_warmup_iters"),
        (_module, lambda: (torch.ones(2, 4),), {"num_warmup_iters": True}, ConfigError,
         "num_warmup_iters"),
        (_module, lambda: (torch.ones(2, 4),), {"fp8_recipe": "fp8"}, ConfigError, "Fp8Recipe"),
        (lambda: "linear", lambda: (torch.ones(2, 4),), {}, InvalidArgumentError, "nn.Module"),
        (_module, lambda: [torch.ones(2, 4)], {}, InvalidArgumentError, "tuple of tensors"),
        (_module, lambda: (), {}, InvalidArgumentError, "non-empty tuple"),
        (_module, lambda: (3,), {}, InvalidArgumentError, "must be a torch.Tensor"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_typed_errors(modules, args, kw, err, match) -> None:
    with pytest.raises(err, match=match):
        make_graphed_callables(modules(), args(), **kw)


def test_module_count_must_match_argument_tuples() -> None:
    with pytest.raises(InvalidArgumentError, match="2 modules but 1 tuples"):
        make_graphed_callables([_module(), _module()], [(torch.ones(2, 4),)])


def test_hooks_are_refused() -> None:
    m = _module()
    m.register_forward_hook(lambda *a: None)
    with pytest.raises(InvalidArgumentError, match="hooks"):
        make_graphed_callables(m, (torch.ones(2, 4),))


def test_buffers_requiring_grad_are_refused() -> None:
    m = _module()
    m.register_buffer("b", torch.ones(2, requires_grad=True))
    with pytest.raises(InvalidArgumentError, match="requires grad"):
        make_graphed_callables(m, (torch.ones(2, 4),))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_without_cuda_the_error_says_so_and_leaves_the_module_alone() -> None:
    m = _module()
    forward = m.forward
    with pytest.raises(UnsupportedHardwareError, match="CUDA device"):
        make_graphed_callables(m, (torch.ones(2, 4),))
    assert m.forward == forward and getattr(m, "_overlap_graphed", None) is None
