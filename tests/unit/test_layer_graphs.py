"""make_graphed_callables' argument checks (NOTE [graphed layers]): typed errors before any
GPU work. The graphs themselves need GPUs: tests/distributed/test_layer_graphs.py."""

from __future__ import annotations

import pytest
import torch

from overlap.errors import ConfigError, InvalidArgumentError, StateError, UnsupportedHardwareError
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


def test_a_parameter_in_a_live_graph_is_refused_until_the_graph_is_dropped() -> None:
    """NOTE [graphed layers]: an earlier step's output still referenced keeps the parameters'
    gradient-accumulation nodes, on that step's stream, and a capture would fail on them."""
    m = _module()
    y = m(torch.ones(2, 4))
    y.sum().backward()  # the backward ran, but y still holds its graph
    with pytest.raises(StateError, match="parameter 'weight' of modules\\[0\\] is still part"):
        make_graphed_callables(m, (torch.ones(2, 4),))
    with torch.no_grad(), pytest.raises(StateError, match="still part"):  # probed with grad on
        make_graphed_callables(m, (torch.ones(2, 4),))
    del y
    with pytest.raises((UnsupportedHardwareError, InvalidArgumentError), match="CUDA"):
        make_graphed_callables(m, (torch.ones(2, 4),))  # past the check
    for p in m.parameters():  # the probe leaves no mark behind
        node = p.view_as(p).grad_fn.next_functions[0][0]
        assert "overlap_probe" not in node.metadata


def test_a_sample_input_in_a_live_graph_is_refused() -> None:
    m = _module()
    x = torch.ones(2, 4, requires_grad=True)
    z = (x * 2).sum()
    with pytest.raises(StateError, match="sample_args\\[0\\]\\[0\\] of modules\\[0\\]"):
        make_graphed_callables(m, (x,))
    del z


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_without_cuda_the_error_says_so_and_leaves_the_module_alone() -> None:
    m = _module()
    forward = m.forward
    with pytest.raises(UnsupportedHardwareError, match="CUDA device"):
        make_graphed_callables(m, (torch.ones(2, 4),))
    assert m.forward == forward and getattr(m, "_overlap_graphed", None) is None


class _FakeGraph:
    """Stands in for overlap.comm.CudaGraph (CPU): records reset()."""

    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


def _fake_graphed(module: torch.nn.Module, in_flight: object = None):
    """``module`` as make_graphed_callables leaves it (a replaying forward and its state),
    with fake graphs: what release_graphs reads and undoes."""
    from overlap.layers.graphs import _Captured

    st = _Captured(
        name=f"{type(module).__name__}#0", fwd=_FakeGraph(), bwd=_FakeGraph(), inputs=(),
        params=(), param_ptrs=(), training=True, recipe=None,
    )  # fmt: skip
    if in_flight is not None:
        st.in_flight = lambda: in_flight
    module.forward = lambda *a: "replayed"  # type: ignore[method-assign]
    module._overlap_graphed = st  # type: ignore[assignment]
    return st


def test_release_graphs_frees_the_graphs_and_makes_the_modules_eager() -> None:
    from overlap.layers import release_graphs

    model = torch.nn.Sequential(_module(), torch.nn.ReLU(), _module())
    states = [_fake_graphed(model[0]), _fake_graphed(model[2])]
    x = torch.ones(2, 4)
    assert model[0](x) == "replayed"
    release_graphs(model)  # the whole model: its graphed submodules are found
    for m, st in zip((model[0], model[2]), states, strict=True):
        assert m._overlap_graphed is None and "forward" not in vars(m)
        assert (st.fwd.resets, st.bwd.resets) == (1, 1)
    assert torch.equal(model(x), model[2](model[1](model[0](x))))  # eager
    release_graphs([model[0]])  # no longer graphed: nothing to do
    assert states[0].fwd.resets == 1


def test_release_graphs_refuses_while_a_backward_is_due_and_releases_nothing() -> None:
    from overlap.errors import StateError
    from overlap.layers import release_graphs

    a, b = _module(), _module()
    st_a = _fake_graphed(a)
    _fake_graphed(b, in_flight=object())
    with pytest.raises(StateError, match="backward has not run"):
        release_graphs([a, b])
    assert a._overlap_graphed is st_a and st_a.fwd.resets == 0


@pytest.mark.parametrize("bad", ["model", [torch.nn.Linear(2, 2), 3], None])
def test_release_graphs_argument_must_be_modules(bad) -> None:
    from overlap.layers import release_graphs

    with pytest.raises(InvalidArgumentError, match="release_graphs"):
        release_graphs(bad)
