"""The tensor-parallel layers in one process (a TP group of one, gloo): configuration and
validation, the FP8 recipe and state, the references. The multi-rank behaviour is
tests/distributed/test_layers.py."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.distributed as dist

from overlap.errors import ConfigError, InvalidArgumentError
from overlap.layers import (
    ColumnParallelLinear,
    Fp8Recipe,
    Fp8Scaling,
    LayerNormMLP,
    RowParallelLinear,
    TensorParallelGroup,
    TransformerLayer,
    fp8_autocast,
    fp8_recipe,
)
from overlap.layers import reference as ref
from overlap.layers.fp8 import Fp8State


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """A process group of one (gloo, a file rendezvous: no port to pick)."""
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    path = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_layers_need_torch_distributed() -> None:
    if dist.is_initialized():
        pytest.skip("a process group exists already")
    with pytest.raises(ConfigError, match="init_torch_distributed"):
        ColumnParallelLinear(16, 16)


def test_fp8_recipe_validation() -> None:
    r = Fp8Recipe(scaling="delayed")
    assert r.scaling is Fp8Scaling.DELAYED
    assert (r.forward_format.name, r.backward_format.name) == ("E4M3", "E5M2")
    assert Fp8Recipe(hybrid=False).backward_format.name == "E4M3"
    with pytest.raises(ConfigError, match="scaling must be one of"):
        Fp8Recipe(scaling="sometimes")
    with pytest.raises(ConfigError, match="hybrid must be True or False"):
        Fp8Recipe(hybrid=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="margin"):
        Fp8Recipe(margin=-1)
    with pytest.raises(ConfigError, match="history_len"):
        Fp8Recipe(scaling="delayed", amax_history_len=0)


def test_fp8_autocast_nests() -> None:
    assert fp8_recipe() is None
    outer, inner = Fp8Recipe(), Fp8Recipe(scaling="delayed")
    with fp8_autocast(outer):
        assert fp8_recipe() is outer
        with fp8_autocast(inner):
            assert fp8_recipe() is inner
        with fp8_autocast(enabled=False):
            assert fp8_recipe() is None
        assert fp8_recipe() is outer
    assert fp8_recipe() is None
    with pytest.raises(ConfigError, match="Fp8Recipe"), fp8_autocast("e4m3"):  # type: ignore[arg-type]
        pass


def test_fp8_state_weight_cache_follows_the_weight() -> None:
    """Quantized once per weight change (its version counter); usages only added; the state
    pickles and deep-copies."""
    state = Fp8State(Fp8Recipe())
    w = torch.nn.Parameter(torch.randn(32, 32))
    q1 = state.weight_fp8("w", w, training=False, is_first_microbatch=None)
    assert q1.has_rowwise and not q1.has_columnwise
    q2 = state.weight_fp8("w", w, training=True, is_first_microbatch=None)
    assert q2.has_columnwise  # added
    data = q2.rowwise_data.clone()
    q3 = state.weight_fp8("w", w, training=False, is_first_microbatch=None)
    assert q3.has_columnwise, "a usage was dropped"
    assert torch.equal(q3.rowwise_data.view(torch.uint8), data.view(torch.uint8))
    with torch.no_grad():
        w.mul_(2.0)  # an optimizer step: the version counter moves
    q4 = state.weight_fp8("w", w, training=False, is_first_microbatch=None)
    fresh = Fp8State(Fp8Recipe()).weight_fp8("w", w, training=True, is_first_microbatch=None)
    for a, b in zip(q4.tensors(), fresh.tensors(), strict=True):
        assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                           b.view(torch.uint8) if b.element_size() == 1 else b)  # fmt: skip
    q5 = state.weight_fp8("w", w, training=True, is_first_microbatch=False)
    assert q5 is q4  # reused, not re-quantized
    for clone in (pickle.loads(pickle.dumps(state)), copy.deepcopy(state)):
        assert clone.recipe == state.recipe and clone.input is not state.input


def test_group_is_shared_not_copied(world) -> None:
    tp = TensorParallelGroup(world)
    assert copy.deepcopy(tp) is tp and copy.copy(tp) is tp
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(tp)
    layer = ColumnParallelLinear(16, 32, tp_group=world)
    twin = copy.deepcopy(layer)
    assert twin.tp is layer.tp and twin.weight is not layer.weight


def test_configuration_errors(world) -> None:
    with pytest.raises(ConfigError, match="needs userbuffers"):
        ColumnParallelLinear(16, 32, tp_group=world, ub_bulk_dgrad=True)
    with pytest.raises(ConfigError, match="gemm must be one of"):
        RowParallelLinear(16, 32, tp_group=world, gemm="qkv")
    with pytest.raises(ConfigError, match="in_features must be a positive int"):
        ColumnParallelLinear(0, 32, tp_group=world)
    with pytest.raises(ConfigError, match="True, False or None"):
        RowParallelLinear(16, 32, tp_group=world, ub_overlap_rs="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="activation must be one of"):
        LayerNormMLP(16, 32, tp_group=world, activation="relu")
    with pytest.raises(ConfigError, match="divisible"):
        TransformerLayer(32, 64, 6, num_query_groups=4, tp_group=world)
    with pytest.raises(ConfigError, match="fp8_recipe must be an Fp8Recipe"):
        ColumnParallelLinear(16, 32, tp_group=world, fp8_recipe="e4m3")  # type: ignore[arg-type]
    layer = ColumnParallelLinear(16, 32, tp_group=world, fuse_wgrad_accumulation=True)
    with pytest.raises(ConfigError, match="main_grad"):
        layer(torch.randn(4, 16))
    with pytest.raises(InvalidArgumentError, match=r"\[tokens, 16\]"):
        ColumnParallelLinear(16, 32, tp_group=world)(torch.randn(4, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tp1_layers_match_their_references(world, dtype: torch.dtype) -> None:
    """With a TP group of one, each layer is its reference (float32 parameters cast to the
    input's dtype for the GEMMs: the mixed-precision path)."""
    torch.manual_seed(0)
    h, f, tokens = 32, 64, 12
    x = torch.randn(tokens, h).to(dtype)
    cases = [
        (ColumnParallelLinear(h, f, tp_group=world), ref.linear),
        (RowParallelLinear(f, h, tp_group=world), ref.linear),
        (LayerNormMLP(h, f, activation="swiglu", tp_group=world),
         lambda x, s: ref.layernorm_mlp(x, s, "swiglu")),
    ]  # fmt: skip
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for layer, reference in cases:
        inp = x if layer.__class__ is not RowParallelLinear else torch.randn(tokens, f).to(dtype)
        y = layer(inp)
        assert y.dtype == dtype
        want = reference(inp.float(), layer.full_state_dict())
        err = (y.float() - want).abs().max() / want.abs().max()
        assert err < tol, (type(layer).__name__, float(err))
    t = TransformerLayer(h, f, 8, num_query_groups=2, tp_group=world)
    x3 = torch.randn(6, 2, h).to(dtype)
    want = ref.transformer_layer(
        x3.float(), t.full_state_dict(), num_attention_heads=8, num_query_groups=2
    )
    err = (t(x3).float() - want).abs().max() / want.abs().max()
    assert err < tol, float(err)
