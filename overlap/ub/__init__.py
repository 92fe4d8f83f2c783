"""Userbuffers set-up for a transformer layer: ``initialize_ub`` / ``get_ub`` / ``destroy_ub``.

One call builds the communicator of the TP group, the symmetric buffers and the overlap op
objects of the standard GEMM names (``qkv``/``proj``/``fc1``/``fc2`` x ``fprop``/``dgrad``/
``wgrad``), from a typed configuration that is validated before anything collective happens.

* :mod:`~overlap.ub.names`: the GEMM names, their methods (:class:`OverlapMethod`) and which
  runs by default (:func:`default_method`; NOTE [ub bulk], NOTE [ub gathered inputs]);
* :mod:`~overlap.ub.config`: :class:`GemmOverlapConfig` (what a user gives one name), one
  config per method with the core's defaults (:class:`RingAgConfig`, :class:`PipelineRsConfig`,
  :class:`RingRsConfig`, :class:`BulkAgConfig`, :class:`BulkRsConfig`,
  :class:`NoOverlapConfig`) and :class:`UbConfig`;
* :mod:`~overlap.ub.te_dict`: TransformerEngine ``ub_cfgs`` dicts
  (:meth:`UbConfig.from_te_dict`);
* :mod:`~overlap.ub.handle`: :class:`Userbuffers`, :func:`initialize_ub` and the default
  registry (NOTE [ub buffer sharing], NOTE [ub environment]);
* :mod:`~overlap.ub.plans`: :class:`ShapePlans`, whether each GEMM shape runs its overlap op
  or the sequential path (:class:`PlanPolicy`, NOTE [shape plans]).

Every tuning default and limit is the C++ core's (NOTE [overlap defaults] in
``csrc/comm/overlap/overlap_ops.h``; the TP 2 ones: NOTE [ub tp 2] in
``csrc/comm/overlap/defaults.cpp``).
"""

from overlap.ub.config import (
    BulkAgConfig,
    BulkRsConfig,
    GemmOverlapConfig,
    MethodConfig,
    NoOverlapConfig,
    PipelineRsConfig,
    RingAgConfig,
    RingRsConfig,
    UbConfig,
    method_config_class,
    plan_label,
)
from overlap.ub.handle import Userbuffers, destroy_ub, get_ub, initialize_ub
from overlap.ub.names import (
    GEMM_NAMES,
    LAYERS,
    PASSES,
    OverlapMethod,
    allowed_methods,
    default_method,
)
from overlap.ub.plans import PlanPolicy, ShapeKey, ShapePlan, ShapePlans

__all__ = [
    "GEMM_NAMES",
    "LAYERS",
    "PASSES",
    "BulkAgConfig",
    "BulkRsConfig",
    "GemmOverlapConfig",
    "MethodConfig",
    "NoOverlapConfig",
    "OverlapMethod",
    "PipelineRsConfig",
    "PlanPolicy",
    "RingAgConfig",
    "RingRsConfig",
    "ShapeKey",
    "ShapePlan",
    "ShapePlans",
    "UbConfig",
    "Userbuffers",
    "allowed_methods",
    "default_method",
    "destroy_ub",
    "get_ub",
    "initialize_ub",
    "method_config_class",
    "plan_label",
]
