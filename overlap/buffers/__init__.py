"""Userbuffer managers: copy quantized shards (data + scale_inv) into symmetric buffers and hand
gathered tensors out, never letting a saved activation alias a buffer (docs/design.md §3).

* :mod:`~overlap.buffers.layout`: the byte layout of each part (rowwise / columnwise data and
  scale_inv) per format: 256-byte aligned regions of ``tp_size`` slots;
* :mod:`~overlap.buffers.manager`: :class:`GatherBuffer` (``copy_into_buffer``, ``gather``,
  ``get_buffer``) and the transient :class:`BufferView` it hands out;
* :mod:`~overlap.buffers.aliasing`: :func:`saveable` / :func:`detach_from_buffer`, which copy
  or refuse tensors that alias a userbuffer before they are saved for backward;
* :mod:`~overlap.buffers.helpers`: :func:`gather_activation` (forward) and
  :func:`gather_for_wgrad` (backward, from the saved local shard).
"""

from overlap.buffers.aliasing import AliasPolicy, aliases_buffer, detach_from_buffer, saveable
from overlap.buffers.helpers import gather_activation, gather_for_wgrad
from overlap.buffers.layout import (
    GatherLayout,
    PartKind,
    PartLayout,
    alignment,
    gather_layout,
    gathered_directions,
)
from overlap.buffers.manager import BufferView, FormatSpec, GatherBuffer, required_nbytes

__all__ = [
    "ALIGNMENT",
    "AliasPolicy",
    "BufferView",
    "FormatSpec",
    "GatherBuffer",
    "GatherLayout",
    "PartKind",
    "PartLayout",
    "aliases_buffer",
    "alignment",
    "detach_from_buffer",
    "gather_activation",
    "gather_for_wgrad",
    "gather_layout",
    "gathered_directions",
    "required_nbytes",
    "saveable",
]


def __getattr__(name: str) -> int:
    # ALIGNMENT: the runtime's slot alignment (overlap.buffers.layout.alignment), read lazily.
    if name == "ALIGNMENT":
        return alignment()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
