"""Tensor-parallel, sequence-parallel layers driven by the userbuffers ops.

* :class:`ColumnParallelLinear` (qkv, fc1) and :class:`RowParallelLinear` (proj, fc2):
  :mod:`overlap.layers.linear`;
* :class:`LayerNormLinear` and :class:`LayerNormMLP` (GELU or SwiGLU), with LayerNorm or
  RMSNorm: :mod:`overlap.layers.layernorm`;
* :class:`TransformerLayer`: pre-norm attention (grouped-query, causal) and MLP,
  :mod:`overlap.layers.transformer`;
* FP8: :class:`Fp8Recipe`, :func:`fp8_autocast` (:mod:`overlap.layers.fp8`);
* :func:`make_graphed_callables`: a layer's forward and backward captured as CUDA graphs and
  replayed (a step issued without Python, NOTE [graphed layers] in :mod:`overlap.layers.graphs`);
  :func:`release_graphs` frees them before the process group is destroyed;
* :func:`all_reduce_grad`: for a model's own replicated parameters applied to this rank's
  tokens (an embedding, a final norm): their gradients summed over the TP group.

Each layer takes a :class:`~overlap.ub.Userbuffers` handle (``ub=``) for its overlap ops, or
None for plain ``torch.distributed`` collectives on its TP group (the same math, no
overlap). The schedule, the saved tensors and the FP8 recipe are described in docs/design.md
§9; the communicating steps are ``torch.library`` custom ops (NOTE [layer custom ops] in
:mod:`overlap.layers._ops`), so ``torch.compile`` traces the layers without graph breaks.
"""

from overlap.layers._functions import all_reduce_grad
from overlap.layers._tp import TensorParallelGroup
from overlap.layers.fp8 import Fp8Recipe, Fp8Scaling, fp8_autocast, fp8_recipe
from overlap.layers.graphs import make_graphed_callables, release_graphs
from overlap.layers.layernorm import Activation, LayerNormLinear, LayerNormMLP, Normalization
from overlap.layers.linear import ColumnParallelLinear, RowParallelLinear
from overlap.layers.transformer import TransformerLayer

__all__ = [
    "Activation",
    "ColumnParallelLinear",
    "Fp8Recipe",
    "Fp8Scaling",
    "LayerNormLinear",
    "LayerNormMLP",
    "Normalization",
    "RowParallelLinear",
    "TensorParallelGroup",
    "TransformerLayer",
    "all_reduce_grad",
    "fp8_autocast",
    "fp8_recipe",
    "make_graphed_callables",
    "release_graphs",
]
