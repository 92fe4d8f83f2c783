"""FP8 for the tensor-parallel layers: a recipe, an autocast context and each layer's state.

A :class:`Fp8Recipe` says how every GEMM operand of a layer is quantized: per-tensor FP8 with
current scaling (the scale of this call's amax) or delayed scaling (the scale of an amax
history), forward operands in E4M3 and gradients in E5M2 (``hybrid``, the default) or E4M3.
Turn it on for a region with :func:`fp8_autocast`, or per layer (``fp8_recipe=``)::

    with overlap.layers.fp8_autocast(Fp8Recipe()):
        y = layer(x)
    y.sum().backward()  # the backward uses the recipe of its forward

NOTE [layer fp8 state] (docs/design.md §3-§4, §9): each layer keeps one :class:`Fp8State`
per recipe: plain quantizers (picklable, deep-copyable: no group is stored in them) for its
input, its weight and its output gradient, and the cached quantized weight.

* The amax of a tensor that is gathered (a column-parallel layer's input, a row-parallel
  layer's output gradient) is all-reduced over the TP group before the cast, so every shard
  and the gathered tensor share one scale (invariant 3). The group is passed at the call.
  Delayed scaling records that reduced amax, so its history is the same on every rank.
  Tensors that stay local (the other operands, the weight shards) keep their own scale.
* The weight is quantized once per optimizer step: the cache is refreshed when the weight's
  version counter moved (the optimizer's in-place update) or when the caller says so
  (``is_first_microbatch``), and its usages are only ever added (invariant 4), so training
  after evaluation never reads stale transposed data.
* A saved or gathered FP8 tensor carries its own scale_inv (invariant 1): the backward never
  asks a quantizer, which pipeline parallelism may have run again since.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlap.errors import ConfigError
from overlap.quantization import (
    AmaxComputeAlgo,
    CachedWeight,
    CurrentScalingConfig,
    CurrentScalingQuantizer,
    DelayedScalingConfig,
    DelayedScalingQuantizer,
    Fp8Format,
    QuantizedTensor,
    Quantizer,
)

if TYPE_CHECKING:
    import torch

__all__ = ["Fp8Recipe", "Fp8Scaling", "Fp8State", "fp8_autocast", "fp8_recipe"]


class Fp8Scaling(enum.Enum):
    """How a per-tensor FP8 scale is chosen."""

    CURRENT = "current"  #: from this call's amax (reduced over the TP group where gathered)
    DELAYED = "delayed"  #: from the amax history of earlier calls


@dataclass(frozen=True)
class Fp8Recipe:
    """How the layers quantize their GEMM operands (per-tensor FP8 on Hopper).

    Attributes:
        scaling: :class:`Fp8Scaling` (or its value string).
        hybrid: gradients in E5M2 (more range), forward operands in E4M3; False: all E4M3.
        margin: scale headroom in powers of two, 0..127.
        power_of_2_scales: current scaling: round scales down to powers of two.
        amax_history_len: delayed scaling: amaxes kept, >= 1.
        amax_compute_algo: delayed scaling: ``"max"`` of the history or ``"most_recent"``.
    """

    scaling: Fp8Scaling = Fp8Scaling.CURRENT
    hybrid: bool = True
    margin: int = 0
    power_of_2_scales: bool = False
    amax_history_len: int = 1024
    amax_compute_algo: AmaxComputeAlgo = AmaxComputeAlgo.MAX

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "scaling", Fp8Scaling(self.scaling))
        except ValueError:
            raise ConfigError(
                f"Fp8Recipe.scaling must be one of {[s.value for s in Fp8Scaling]}, got "
                f"{self.scaling!r}"
            ) from None
        for name in ("hybrid", "power_of_2_scales"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"Fp8Recipe.{name} must be True or False")
        # The quantizer configs validate the numbers (margin, history) with their messages.
        self.quantizer(forward=True)

    @property
    def forward_format(self) -> Fp8Format:
        return Fp8Format.E4M3

    @property
    def backward_format(self) -> Fp8Format:
        return Fp8Format.E5M2 if self.hybrid else Fp8Format.E4M3

    def quantizer(self, *, forward: bool) -> Quantizer:
        """A new quantizer of this recipe for a forward operand or a gradient."""
        fp8 = self.forward_format if forward else self.backward_format
        if self.scaling is Fp8Scaling.CURRENT:
            return CurrentScalingQuantizer(
                CurrentScalingConfig(fp8=fp8, margin=self.margin, power_of_2=self.power_of_2_scales)
            )
        return DelayedScalingQuantizer(
            DelayedScalingConfig(
                fp8=fp8,
                margin=self.margin,
                history_len=self.amax_history_len,
                amax_compute_algo=self.amax_compute_algo,
            )
        )


_ACTIVE: list[Fp8Recipe | None] = [None]


@contextlib.contextmanager
def fp8_autocast(recipe: Fp8Recipe | None = None, *, enabled: bool = True) -> Iterator[None]:
    """Layers run their forward GEMMs in FP8 with ``recipe`` (default :class:`Fp8Recipe`)
    inside the block (a layer's own ``fp8_recipe`` wins). The backward of a forward run in
    FP8 is FP8 too, wherever it runs. ``enabled=False`` turns FP8 off inside the block."""
    if recipe is not None and not isinstance(recipe, Fp8Recipe):
        raise ConfigError(f"fp8_autocast: recipe must be an Fp8Recipe, got {type(recipe)}")
    _ACTIVE.append((recipe or Fp8Recipe()) if enabled else None)
    try:
        yield
    finally:
        _ACTIVE.pop()


def fp8_recipe() -> Fp8Recipe | None:
    """The recipe of the innermost :func:`fp8_autocast`, or None outside one."""
    return _ACTIVE[-1]


class Fp8State:
    """One layer's FP8 quantizers and cached weights for one recipe (NOTE [layer fp8 state]).

    A plain object: it pickles and deep-copies with the layer's quantizers and caches.
    """

    def __init__(self, recipe: Fp8Recipe) -> None:
        self.recipe = recipe
        self.input = recipe.quantizer(forward=True)
        self.weight = recipe.quantizer(forward=True)
        self.grad = recipe.quantizer(forward=False)
        self._caches: dict[str, CachedWeight] = {}
        self._versions: dict[str, int] = {}

    def weight_fp8(
        self,
        name: str,
        weight: torch.Tensor,
        *,
        training: bool,
        is_first_microbatch: bool | None,
    ) -> QuantizedTensor:
        """The cached FP8 weight ``name`` with rowwise data, and columnwise data when
        ``training`` (usages only added). Re-quantized when ``is_first_microbatch`` is True,
        or (None) when the weight changed since the last call."""
        cache = self._caches.get(name)
        if cache is None:
            cache = self._caches[name] = CachedWeight()
        version = int(weight._version)
        if is_first_microbatch is None:
            update = self._versions.get(name) != version or cache.tensor is None
        else:
            update = bool(is_first_microbatch) or cache.tensor is None
        self._versions[name] = version
        return cache.get(
            weight.detach(), self.weight, rowwise=True, columnwise=training, update=update
        )
