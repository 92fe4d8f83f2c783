"""Cached quantized weights: usages are only ever added (docs/design.md §3, invariant 4).

NOTE [usages only added]: a weight is quantized once per optimizer step and reused by every
micro-batch (and, across steps, by evaluation). Training needs the columnwise (transposed)
data for dgrad, evaluation only the rowwise data. If an evaluation step re-quantized only the
rowwise data of the cache, the columnwise data would keep the weights of the step before and
the next training step's dgrad would silently use stale weights (docs/design.md §3,
invariant 4). So a :class:`CachedWeight` remembers every usage it was ever asked for and
re-quantizes all of them whenever the weight changes, whatever the current step needs.

NOTE [recipe change]: a cached tensor holds data of one format per direction. When the
quantizer's formats differ from the cached ones (the recipe changed, e.g. per-tensor FP8 to
block FP8), the cache is re-quantized from the high-precision weight in the new formats
(keeping every usage), or, with ``RecipeChangePolicy.RAISE``, refuses with a clear error. It
never hands out a tensor mixing directions of two recipes.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from overlap.errors import ConfigError, InvalidArgumentError, StateError
from overlap.quantization.quantizers import Quantizer
from overlap.quantization.tensor import QuantizedTensor

if TYPE_CHECKING:
    import torch

__all__ = ["CachedWeight", "RecipeChangePolicy"]


class RecipeChangePolicy(enum.Enum):
    """What :meth:`CachedWeight.get` does when the quantizer's formats differ from the cache's."""

    REQUANTIZE = "requantize"  #: re-quantize every cached usage from the high-precision weight
    RAISE = "raise"  #: raise StateError


class CachedWeight:
    """The quantized copy of one high-precision weight, kept across micro-batches and steps.

    Args:
        on_recipe_change: see :class:`RecipeChangePolicy` (default: re-quantize).

    A plain object (picklable, deep-copyable); the returned tensor is the cache itself, marked
    :attr:`QuantizedTensor.cached` (its usages cannot be dropped), and is rewritten in place
    by later calls with ``update=True``.
    """

    def __init__(
        self, *, on_recipe_change: RecipeChangePolicy | str = RecipeChangePolicy.REQUANTIZE
    ) -> None:
        try:
            self.on_recipe_change = RecipeChangePolicy(on_recipe_change)
        except ValueError:
            raise ConfigError(
                f"on_recipe_change must be one of {[p.value for p in RecipeChangePolicy]}, got "
                f"{on_recipe_change!r}"
            ) from None
        self._tensor: QuantizedTensor | None = None
        self._usages = (False, False)

    @property
    def tensor(self) -> QuantizedTensor | None:
        """The cached tensor (None before the first :meth:`get` or after :meth:`clear`)."""
        return self._tensor

    @property
    def usages(self) -> tuple[bool, bool]:
        """``(rowwise, columnwise)``: every usage ever requested since the last clear."""
        return self._usages

    def clear(self) -> None:
        """Drop the cache (e.g. when the weight is replaced); usages start afresh."""
        self._tensor = None
        self._usages = (False, False)

    def get(
        self,
        weight: torch.Tensor,
        quantizer: Quantizer,
        *,
        rowwise: bool = True,
        columnwise: bool,
        update: bool = True,
        amax_group: Any | None = None,
    ) -> QuantizedTensor:
        """The quantized weight with (at least) the requested usages.

        Args:
            weight: the high-precision weight ``[N, K]`` (any shape the quantizer takes).
            quantizer: the weight quantizer of the current recipe (its usage flags are not
                consulted; delayed-scaling state is updated by every quantization).
            rowwise: this step needs rowwise data (forward).
            columnwise: this step needs columnwise data (dgrad), i.e. it is a training step.
            update: the weight may have changed since the last call (first micro-batch after
                an optimizer step): re-quantize every cached usage, in place when the cached
                directions are unchanged. False: reuse the cache, only adding usages it lacks
                (by transposing where exact, else by quantizing that direction from
                ``weight``).
            amax_group: passed to :meth:`Quantizer.quantize` (never stored).

        Returns:
            The cached :class:`QuantizedTensor`; it holds every usage requested since the last
            :meth:`clear`, all of the current weight.

        Raises:
            StateError: the recipe changed and the policy is ``RAISE``.
        """
        import torch

        if not isinstance(quantizer, Quantizer):
            raise InvalidArgumentError(
                f"CachedWeight.get: quantizer must be a Quantizer, got {type(quantizer).__name__}"
            )
        if not isinstance(weight, torch.Tensor):
            raise InvalidArgumentError(
                f"CachedWeight.get: weight must be a torch.Tensor, got {type(weight).__name__}"
            )
        need = (self._usages[0] or bool(rowwise), self._usages[1] or bool(columnwise))
        if not any(need):
            raise InvalidArgumentError("CachedWeight.get: rowwise and columnwise both False")
        t = self._tensor
        if t is not None and t.formats != quantizer.formats:
            if self.on_recipe_change is RecipeChangePolicy.RAISE:
                raise StateError(
                    f"the weight's recipe changed: cached formats (rowwise {t.formats[0]}, "
                    f"columnwise {t.formats[1]}) differ from the quantizer's (rowwise "
                    f"{quantizer.formats[0]}, columnwise {quantizer.formats[1]}); use "
                    "RecipeChangePolicy.REQUANTIZE or clear() the cache"
                )
            t = None
        if t is not None and (
            t.shape != tuple(weight.shape) or t.dtype != weight.dtype or t.device != weight.device
        ):
            t = None  # a different weight tensor: start from it
        if t is None:
            t = quantizer.quantize(
                weight, rowwise=need[0], columnwise=need[1], amax_group=amax_group
            )
        elif update:
            if (t.has_rowwise, t.has_columnwise) == need:
                quantizer.quantize(
                    weight, out=t, amax_group=amax_group, rowwise=need[0], columnwise=need[1]
                )
            else:
                t = quantizer.quantize(
                    weight, rowwise=need[0], columnwise=need[1], amax_group=amax_group
                )
        else:
            held = (t.has_rowwise, t.has_columnwise)
            for col in (False, True):
                if not need[col] or held[col]:
                    continue
                if t.can_derive(columnwise=col):
                    t.update_usage(**{("columnwise" if col else "rowwise"): True})
                else:
                    part = quantizer.quantize(
                        weight, rowwise=not col, columnwise=col, amax_group=amax_group
                    )
                    t._adopt(part, columnwise=col)
        t._cached = True
        self._tensor = t
        self._usages = (t.has_rowwise, t.has_columnwise)
        return t

    def __repr__(self) -> str:
        return f"CachedWeight(usages={self._usages}, tensor={self._tensor!r})"
