"""CachedWeight: usages only added (docs/design.md §3, invariant 4), alternating training and
evaluation steps (the stale-columnwise bug), in-place updates, recipe changes."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from overlap.errors import ConfigError, InvalidArgumentError, StateError  # noqa: E402
from overlap.quantization import (  # noqa: E402
    BlockScalingConfig,
    BlockScalingQuantizer,
    CachedWeight,
    CurrentScalingQuantizer,
    DelayedScalingConfig,
    DelayedScalingQuantizer,
    HybridQuantizer,
    MXFP8Quantizer,
    RecipeChangePolicy,
)
from tests.unit.quantizer_cases import assert_within_fp8_error, random_nd  # noqa: E402

WEIGHT_QUANTIZERS = {
    "current": CurrentScalingQuantizer,
    "delayed": lambda: DelayedScalingQuantizer(DelayedScalingConfig(history_len=1)),
    "block1x128": BlockScalingQuantizer,
    "block128x128": lambda: BlockScalingQuantizer(BlockScalingConfig(block="block_128x128")),
    "mxfp8": MXFP8Quantizer,
    "hybrid": lambda: HybridQuantizer(CurrentScalingQuantizer(), BlockScalingQuantizer()),
}


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    w1 = random_nd((160, 96), torch.bfloat16, seed=1)
    w2 = -2.0 * random_nd((160, 96), torch.bfloat16, seed=2)  # far from w1
    return w1, w2


def _reads(t: Any, w: torch.Tensor, columnwise: bool) -> bool:
    """True if that direction of ``t`` holds ``w`` (within FP8 error)."""
    try:
        assert_within_fp8_error(t, w, columnwise=columnwise)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("name", list(WEIGHT_QUANTIZERS))
def test_alternating_train_and_eval_never_leaves_stale_columnwise(name: str) -> None:
    """Invariant 4: an evaluation step (rowwise only) after a training step must not leave the
    columnwise data of the old weights for the next training step."""
    q = WEIGHT_QUANTIZERS[name]()
    w1, w2 = _weights()
    cache = CachedWeight()
    t = cache.get(w1, q, columnwise=True)  # training step 1
    if name == "delayed":  # let the history see the weights, then quantize for real
        t = cache.get(w1, q, columnwise=True)
    assert _reads(t, w1, columnwise=True)
    # optimizer step -> w2; evaluation step: forward only, the weight changed
    if name == "delayed":
        cache.get(w2, q, columnwise=False)
    t = cache.get(w2, q, columnwise=False, update=True)
    assert t.has_columnwise, "an evaluation step dropped the cached columnwise usage"
    assert _reads(t, w2, columnwise=False)
    # training step 2, first micro-batch reuses the cache (the weight did not change since)
    t = cache.get(w2, q, columnwise=True, update=False)
    assert _reads(t, w2, columnwise=True), "stale columnwise data of the previous weights"
    assert not _reads(t, w1, columnwise=True)
    assert cache.usages == (True, True)


@pytest.mark.parametrize("name", list(WEIGHT_QUANTIZERS))
def test_eval_first_then_train_adds_the_columnwise_usage(name: str) -> None:
    q = WEIGHT_QUANTIZERS[name]()
    w1, _ = _weights()
    cache = CachedWeight()
    if name == "delayed":
        cache.get(w1, q, columnwise=False)
    t = cache.get(w1, q, columnwise=False)
    assert (t.has_rowwise, t.has_columnwise) == (True, False)
    row_bytes = t.rowwise_data.clone()
    t2 = cache.get(w1, q, columnwise=True, update=False)
    assert t2 is t and t.has_columnwise  # added in place, to the same tensor
    assert torch.equal(t.rowwise_data.view(torch.uint8), row_bytes.view(torch.uint8))
    assert _reads(t, w1, columnwise=True) and _reads(t, w1, columnwise=False)
    if name in ("current", "delayed", "block128x128"):
        # exact formats: the columnwise data are the rowwise data transposed
        assert torch.equal(t.dequantize(columnwise=True), t.dequantize(columnwise=False))


def test_update_rewrites_in_place() -> None:
    w1, w2 = _weights()
    cache = CachedWeight()
    q = CurrentScalingQuantizer()
    t = cache.get(w1, q, columnwise=True)
    ptrs = [p.data_ptr() for p in t.tensors() if p is not None]
    assert cache.get(w2, q, columnwise=False) is t  # update=True by default
    assert [p.data_ptr() for p in t.tensors() if p is not None] == ptrs
    assert _reads(t, w2, columnwise=True) and _reads(t, w2, columnwise=False)
    # update=False does not look at the weight at all
    assert cache.get(w1, q, columnwise=True, update=False) is t
    assert _reads(t, w2, columnwise=True)


def test_usages_are_only_added() -> None:
    w1, _ = _weights()
    cache = CachedWeight()
    q = MXFP8Quantizer()
    t = cache.get(w1, q, rowwise=False, columnwise=True)
    assert cache.usages == (False, True)
    t = cache.get(w1, q, rowwise=True, columnwise=False)
    assert cache.usages == (True, True) and t.has_rowwise and t.has_columnwise
    with pytest.raises(StateError, match="only ever added"):
        t.update_usage(rowwise=False)
    cache.clear()
    assert cache.tensor is None and cache.usages == (False, False)
    t = cache.get(w1, q, columnwise=False)
    assert (t.has_rowwise, t.has_columnwise) == (True, False)


def test_recipe_change_requantizes_from_the_high_precision_weight() -> None:
    w1, _ = _weights()
    cache = CachedWeight()
    t_old = cache.get(w1, CurrentScalingQuantizer(), columnwise=True)
    block = BlockScalingQuantizer()
    t = cache.get(w1, block, columnwise=False, update=False)  # even without update
    assert t is not t_old and t.formats == block.formats
    assert t.has_columnwise  # the usage added under the old recipe is kept
    assert _reads(t, w1, columnwise=True) and _reads(t, w1, columnwise=False)
    # Never a mix: both directions have the new recipe's formats.
    assert t.rowwise_format == t.columnwise_format == block.rowwise_format


def test_recipe_change_can_be_refused() -> None:
    w1, _ = _weights()
    cache = CachedWeight(on_recipe_change="raise")
    assert cache.on_recipe_change is RecipeChangePolicy.RAISE
    cache.get(w1, CurrentScalingQuantizer(), columnwise=True)
    hybrid = HybridQuantizer(CurrentScalingQuantizer(), MXFP8Quantizer())
    with pytest.raises(StateError, match=r"recipe changed: cached formats .* differ"):
        cache.get(w1, hybrid, columnwise=True)
    # The same formats from a differently configured quantizer are not a recipe change.
    cache.get(w1, DelayedScalingQuantizer(), columnwise=True)


def test_new_weight_shape_starts_afresh() -> None:
    cache = CachedWeight()
    q = CurrentScalingQuantizer()
    t = cache.get(torch.randn(8, 16), q, columnwise=True)
    w = torch.randn(4, 16)
    t2 = cache.get(w, q, columnwise=False, update=False)
    assert t2 is not t and t2.shape == (4, 16) and t2.has_columnwise
    assert _reads(t2, w, columnwise=True)


def test_cached_weight_is_a_plain_object() -> None:
    cache = CachedWeight()
    w1, _ = _weights()
    t = cache.get(w1, BlockScalingQuantizer(), columnwise=True)
    for clone in (pickle.loads(pickle.dumps(cache)), copy.deepcopy(cache)):
        assert clone.usages == cache.usages and clone.tensor.cached
        assert torch.equal(clone.tensor.dequantize(), t.dequantize())
    assert "CachedWeight(usages=(True, True)" in repr(cache)


def test_cached_weight_validation() -> None:
    with pytest.raises(
        ConfigError, match=r"on_recipe_change must be one of \['requantize', 'raise'\]"
    ):
        CachedWeight(on_recipe_change="ignore")
    with pytest.raises(InvalidArgumentError, match="quantizer must be a Quantizer"):
        CachedWeight().get(torch.randn(4, 4), "fp8", columnwise=True)
    with pytest.raises(InvalidArgumentError, match=r"weight must be a torch\.Tensor, got list"):
        CachedWeight().get([1.0], MXFP8Quantizer(), columnwise=True)
    with pytest.raises(InvalidArgumentError, match="rowwise and columnwise both False"):
        CachedWeight().get(torch.randn(4, 4), MXFP8Quantizer(), rowwise=False, columnwise=False)
