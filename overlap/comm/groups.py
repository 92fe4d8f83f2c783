"""Group resolution: whatever names a TP group, as the :class:`Bootstrap` the runtime runs on.

Users hold their TP group in the form their framework gives them: a ``torch.distributed``
ProcessGroup, a DeviceMesh (one of whose dimensions is TP), an mpi4py communicator, or an
overlap :class:`~overlap.comm.Bootstrap` already. :func:`as_bootstrap` turns each into a
Bootstrap (docs/design.md §2: the bootstrap is injected), so that the layers above take any of
them (``initialize_ub(shape, tp_group, ...)``).
"""

from __future__ import annotations

from typing import Any

from overlap.comm.bootstrap import Bootstrap, MPIBootstrap, TorchBootstrap
from overlap.errors import ConfigError

__all__ = ["as_bootstrap"]


def as_bootstrap(tp_group: Any, mesh_dim: int | str | None = None) -> Bootstrap:
    """A Bootstrap for a Bootstrap (itself), a torch ProcessGroup, a DeviceMesh (dimension
    ``mesh_dim``; needed unless the mesh is 1-D), or an mpi4py communicator.

    Raises:
        ConfigError: anything else; a multi-dimensional DeviceMesh without ``mesh_dim``;
            ``mesh_dim`` with a group that is not a DeviceMesh (a Bootstrap ignores it).
    """
    if isinstance(tp_group, Bootstrap):
        return tp_group
    if hasattr(tp_group, "get_group") and hasattr(tp_group, "mesh"):  # DeviceMesh
        if mesh_dim is None and tp_group.ndim != 1:
            raise ConfigError(
                f"tp_group: a {tp_group.ndim}-D DeviceMesh needs mesh_dim= (its TP dimension; "
                f"names: {tp_group.mesh_dim_names})"
            )
        return TorchBootstrap(tp_group.get_group(mesh_dim if mesh_dim is not None else 0))
    if mesh_dim is not None:
        raise ConfigError("mesh_dim= is only meaningful with a DeviceMesh tp_group")
    if hasattr(tp_group, "Get_rank") and hasattr(tp_group, "Split"):  # mpi4py
        return MPIBootstrap(tp_group)
    try:
        import torch.distributed as dist

        if isinstance(tp_group, dist.ProcessGroup):
            return TorchBootstrap(tp_group)
    except ImportError:
        pass
    raise ConfigError(
        f"tp_group: {type(tp_group).__name__} is not a torch ProcessGroup, a DeviceMesh, an "
        "mpi4py communicator or an overlap.comm.Bootstrap"
    )
