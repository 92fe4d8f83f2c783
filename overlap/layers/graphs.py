"""A layer's forward and backward as CUDA graphs: a training step issued without Python.

A transformer layer's forward + backward costs 6-12 ms of host time in eager PyTorch (a few
hundred kernels and their Python), more than the GPU time of a short step (NOTE [step timing]
in ``benchmarks/common.py``): such a step is bound by the host. :func:`make_graphed_callables`
captures each module's forward and backward once and replays them, as
``torch.cuda.make_graphed_callables`` and TransformerEngine's do, through
:class:`overlap.comm.CudaGraph` so that the overlap ops inside replay with fresh epochs::

    layer = TransformerLayer(..., ub=ub)
    x = torch.randn(s // tp, b, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer = make_graphed_callables(layer, (x,), fp8_recipe=Fp8Recipe())
    for batch in data:
        y = layer(batch)          # replays the forward graph
        y.backward(dy)            # replays the backward graph
        optimizer.step()          # the next forward re-quantizes the FP8 weights

NOTE [graphed layers]: what a replay may and may not assume.

* The captured work is fixed: shapes, dtypes, devices, the module's training mode, the FP8
  recipe and the ``ub`` handle. A call with other shapes (or a different recipe in an
  enclosing :func:`~overlap.layers.fp8_autocast`) raises a typed error before any GPU work;
  the module in the other training mode, or under ``torch.no_grad()``, runs eagerly.
* Python does not run at replay, so every decision the eager layer takes on the host from
  state is taken once, at capture. The one that changes between steps is whether the cached
  FP8 weight is stale (its version counter, NOTE [layer fp8 state]): the capture runs the
  forward with ``is_first_microbatch=True``, so every replay re-quantizes the weights from
  their current values (an optimizer step between replays is always seen). Delayed scaling's
  amax history and scale are device tensors updated in place: replays carry them on.
* A graph's saved activations live at fixed addresses: a second forward of one module before
  the backward of the first would overwrite them, and that backward would return wrong
  gradients. It raises :class:`~overlap.errors.StateError` instead (one graphed module per
  micro-batch in flight: graph one copy per micro-batch for pipeline schedules).
* A graph writes its outputs into the same memory at every replay: handed out as they are, a
  tensor kept from step i would change under its holder at step i + 1. So the outputs and the
  inputs' gradients leave the graph as copies (one read and write of an activation each). The
  parameters' gradients go to autograd's ``AccumulateGrad``, which adopts a gradient tensor
  when it holds the only reference to it: a detached alias of the graph's memory (what
  ``torch.cuda.make_graphed_callables`` returns) becomes the parameter's ``.grad``, and the
  next micro-batch's replay overwrites it. Here they are the graph's tensors themselves, still
  referenced by its state, so ``AccumulateGrad`` copies them into a fresh ``.grad`` or adds
  them to an existing one (a tensor hook on a parameter sees them first: it must not keep
  them). ``fuse_wgrad_accumulation=True`` accumulates into ``main_grad`` inside the graph.
* The parameters must stay the same tensors (``load_state_dict`` and optimizers update them in
  place, which a replay sees); a parameter replaced by another tensor raises StateError.
* Nothing may still hold an autograd graph through a parameter or a sample input when the
  capture starts. A leaf's gradient-accumulation node lives as long as some graph refers to
  it, and a new forward reuses it together with the stream it was made on. An output or a
  loss of an earlier eager step that is still referenced therefore hands that step's stream,
  usually the legacy default stream, to the captured backward. CUDA then rejects the
  dependency ("operation would make the legacy stream depend on a capturing blocking
  stream"), and the capture is lost. Seen on GPUs with ``y = layer(x); y.backward(dy)``
  followed by a capture while ``y`` was still alive. :func:`make_graphed_callables` refuses
  this case with StateError, naming the tensor, before any GPU work. The warm-up drops its
  own graph before the capture, so the captured nodes are made on the capture stream.

Verdict: graphed, a layer step costs one replay per direction on the host, whatever its
kernel count; what it may not do is checked, not assumed.

NOTE [graph teardown]: a graph that captured an NCCL collective (the norm weights' gradient
all-reduce of a sequence-parallel layer, FP8 amax reductions, the ``ub=None`` path) holds a
reference on NCCL's communicator, and NCCL's teardown
(``torch.distributed.destroy_process_group``) waits until every such graph is destroyed: with
a graphed module still alive it never returns (seen on 4 GPUs at the end of the GPT example).
The module holds its graphs, so freeing the model frees them, but a model referenced anywhere
(an optimizer's closure, a traceback, a reference cycle awaiting the collector) keeps them
alive. :func:`release_graphs` frees them at once and makes the modules eager again; call it
before destroying the process group (and before ``Userbuffers.destroy()``, whose buffers the
graphs use). Verdict: teardown is explicit, and the one call that makes it safe is public.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from overlap.comm import CudaGraph
from overlap.errors import ConfigError, InvalidArgumentError, StateError, UnsupportedHardwareError
from overlap.layers import fp8 as _fp8
from overlap.layers._tp import TensorParallelGroup
from overlap.layers.fp8 import Fp8Recipe, fp8_autocast

__all__ = ["make_graphed_callables", "release_graphs"]


@dataclass
class _Captured:
    """One module's graphs and the static tensors they read and write."""

    name: str
    fwd: CudaGraph
    bwd: CudaGraph
    inputs: tuple[torch.Tensor, ...]  # the static user inputs
    params: tuple[torch.nn.Parameter, ...]  # parameters requiring grad, at capture
    param_ptrs: tuple[tuple[int, int], ...]
    training: bool
    recipe: Fp8Recipe | None
    outputs: tuple[torch.Tensor, ...] = ()
    grad_outputs: tuple[torch.Tensor | None, ...] = ()
    grad_inputs: tuple[torch.Tensor | None, ...] = ()  # inputs, then params
    in_flight: Any = None  # weakref to the autograd node of a forward whose backward is due
    keep: tuple[Any, ...] = ()  # objects whose device memory the graphs use (FP8 states)
    output_is_tensor: bool = True


def _check_arguments(
    modules: Sequence[torch.nn.Module], sample_args: Sequence[tuple[torch.Tensor, ...]]
) -> None:
    if len(modules) != len(sample_args):
        raise InvalidArgumentError(
            f"make_graphed_callables: {len(modules)} modules but {len(sample_args)} tuples of "
            "sample arguments; give one tuple per module"
        )
    for i, (module, args) in enumerate(zip(modules, sample_args, strict=True)):
        if not isinstance(module, torch.nn.Module):
            raise InvalidArgumentError(
                f"make_graphed_callables: modules[{i}] must be a torch.nn.Module, got "
                f"{type(module).__name__}"
            )
        if getattr(module, "_overlap_graphed", None) is not None:
            raise StateError(
                f"make_graphed_callables: modules[{i}] ({type(module).__name__}) is already "
                "graphed; graph a fresh copy of the module instead"
            )
        if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks:
            raise InvalidArgumentError(
                f"make_graphed_callables: modules[{i}] has module hooks, which a replay would not "
                "run; register them after graphing"
            )
        if not isinstance(args, tuple) or not args:
            raise InvalidArgumentError(
                f"make_graphed_callables: sample_args[{i}] must be a non-empty tuple of tensors, "
                f"got {type(args).__name__}"
            )
        for j, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                raise InvalidArgumentError(
                    f"make_graphed_callables: sample_args[{i}][{j}] must be a torch.Tensor, got "
                    f"{type(a).__name__} (only tensor arguments can be graphed)"
                )
        for sub in module.modules():
            group = getattr(sub, "tp", None)
            if (
                isinstance(group, TensorParallelGroup)
                and group.size > 1
                and (group.backend != "nccl")
            ):
                raise ConfigError(
                    f"make_graphed_callables: modules[{i}] communicates over a {group.backend!r} "
                    "TP group; its collectives (the no-overlap path, FP8 amax and norm-gradient "
                    "reductions) cannot be captured: give the layers an NCCL group"
                )
        for name, b in module.named_buffers():
            if b.requires_grad:
                raise InvalidArgumentError(
                    f"make_graphed_callables: buffer {name!r} of modules[{i}] requires grad; only "
                    "parameters can be trained through a graph"
                )


def _in_live_graph(leaf: torch.Tensor) -> bool:
    """Whether an autograd graph still refers to ``leaf`` (its gradient-accumulation node is
    alive). The probe marks the node it gets: a node made for the probe dies with it, a
    node some graph holds keeps the mark."""
    with torch.enable_grad():
        node = leaf.view_as(leaf).grad_fn.next_functions[0][0]
        node.metadata["overlap_probe"] = True
        del node
        node = leaf.view_as(leaf).grad_fn.next_functions[0][0]
        return bool(node.metadata.pop("overlap_probe", False))


def _check_no_live_graph(
    modules: Sequence[torch.nn.Module], sample_args: Sequence[tuple[torch.Tensor, ...]]
) -> None:
    """StateError if a parameter or a sample input of a module is still part of an earlier
    forward's autograd graph (NOTE [graphed layers]): the capture would fail on the GPU."""
    gc.collect()  # graphs in reference cycles that nothing reaches any more
    for i, (module, args) in enumerate(zip(modules, sample_args, strict=True)):
        leaves = [
            (f"parameter {name!r}", p) for name, p in module.named_parameters() if p.requires_grad
        ]
        leaves += [
            (f"sample_args[{i}][{j}]", a)
            for j, a in enumerate(args)
            if a.requires_grad and a.grad_fn is None
        ]
        for what, leaf in leaves:
            if _in_live_graph(leaf):
                raise StateError(
                    f"make_graphed_callables: {what} of modules[{i}] is still part of the "
                    "autograd graph of an earlier forward (an output or a loss of that step is "
                    "still referenced). The capture would reuse that graph's gradient "
                    "accumulation on the earlier step's stream, which CUDA refuses during a "
                    "capture. Drop those references (e.g. `del loss, out`) and call again"
                )


def _takes_first_microbatch(module: torch.nn.Module) -> bool:
    try:
        return "is_first_microbatch" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def _run(module: torch.nn.Module, args: tuple[torch.Tensor, ...], first: bool) -> Any:
    return module(*args, is_first_microbatch=True) if first else module(*args)


def _flat_outputs(out: Any, name: str) -> tuple[tuple[torch.Tensor, ...], bool]:
    if isinstance(out, torch.Tensor):
        return (out,), True
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        return tuple(out), False
    raise InvalidArgumentError(
        f"make_graphed_callables: {name} returned {type(out).__name__}; a graphed module must "
        "return a tensor or a tuple of tensors"
    )


def make_graphed_callables(
    modules: torch.nn.Module | Sequence[torch.nn.Module],
    sample_args: tuple[torch.Tensor, ...] | Sequence[tuple[torch.Tensor, ...]],
    *,
    fp8_recipe: Fp8Recipe | None = None,
    num_warmup_iters: int = 3,
    pool: Any = None,
) -> Any:
    """Capture each module's forward and backward as CUDA graphs and make its ``forward``
    replay them (NOTE [graphed layers]).

    Args:
        modules: one module, or several run in this order (the layers of a model): their
            forwards are captured in order and their backwards in reverse, in one memory pool.
            A :class:`~overlap.ub.Userbuffers` handle may serve all of them.
        sample_args: the forward's positional tensor arguments for one module (a tuple), or one
            tuple per module. Their shapes, dtypes and devices are the only ones a replay takes;
            CUDA tensors. An argument that requires grad gets its gradient from the backward
            graph.
        fp8_recipe: the FP8 recipe the graphs run (None: the enclosing
            :func:`~overlap.layers.fp8_autocast`'s, or BF16 outside one). It is captured: at
            replay, an enclosing autocast with another recipe is an error, none is fine.
        num_warmup_iters: eager forward + backward steps before the capture (GEMM plans,
            autotuning, FP8 caches, side streams); >= 1.
        pool: a memory pool handle (``torch.cuda.graph_pool_handle()``) to share with other
            graphs; default: a new one shared by these modules.

    Returns:
        The module (or the list of modules) with ``forward`` replaced: in the training mode it
        was captured in and with grad enabled, a call copies its arguments into the static
        inputs, replays the forward graph and returns copies of the outputs; their backward
        replays the backward graph. ``is_first_microbatch`` is accepted and ignored (every
        replay re-quantizes FP8 weights). Otherwise the eager forward runs.

    Every rank of the modules' TP group must call this with the same modules in the same
    order (the overlap ops are captured on every rank, NOTE [graph capture]).

    Raises:
        InvalidArgumentError: a module has hooks, an argument is not a CUDA tensor, or the
            output is not a tensor or a tuple of tensors.
        ConfigError: ``num_warmup_iters`` < 1, ``fp8_recipe`` is not an Fp8Recipe, or a layer's
            TP group is not an NCCL group (gloo's collectives cannot be captured).
        StateError: a module is already graphed.
        UnsupportedHardwareError: no CUDA device, or overlap was built without CUDA.
    """
    single = isinstance(modules, torch.nn.Module)
    if not single and not isinstance(modules, (list, tuple)):
        raise InvalidArgumentError(
            "make_graphed_callables: modules must be a torch.nn.Module or a list or tuple of "
            f"them, got {type(modules).__name__}"
        )
    mods: list[torch.nn.Module] = [modules] if single else list(modules)  # type: ignore[list-item]
    args_list: list[tuple[torch.Tensor, ...]] = (
        [sample_args] if single else list(sample_args)  # type: ignore[list-item]
    )
    if (
        not isinstance(num_warmup_iters, int)
        or isinstance(num_warmup_iters, bool)
        or (num_warmup_iters < 1)
    ):
        raise ConfigError(
            f"make_graphed_callables: num_warmup_iters must be an int >= 1, got "
            f"{num_warmup_iters!r}"
        )
    if fp8_recipe is not None and not isinstance(fp8_recipe, Fp8Recipe):
        raise ConfigError(
            f"make_graphed_callables: fp8_recipe must be an Fp8Recipe or None, got "
            f"{type(fp8_recipe).__name__}"
        )
    _check_arguments(mods, args_list)
    _check_no_live_graph(mods, args_list)
    if not torch.cuda.is_available():
        raise UnsupportedHardwareError("make_graphed_callables needs a CUDA device")
    for i, args in enumerate(args_list):
        for j, a in enumerate(args):
            if a.device.type != "cuda":
                raise InvalidArgumentError(
                    f"make_graphed_callables: sample_args[{i}][{j}] is on {a.device}; CUDA "
                    "graphs need CUDA tensors"
                )
    recipe = fp8_recipe if fp8_recipe is not None else _fp8.fp8_recipe()
    if pool is None:
        pool = torch.cuda.graph_pool_handle()

    firsts = [_takes_first_microbatch(m) for m in mods]
    states: list[_Captured] = []
    for i, (m, args) in enumerate(zip(mods, args_list, strict=True)):
        params = tuple(p for p in m.parameters() if p.requires_grad)
        states.append(
            _Captured(
                name=f"{type(m).__name__}#{i}",
                fwd=CudaGraph(pool=pool),
                bwd=CudaGraph(pool=pool),
                inputs=args,
                params=params,
                param_ptrs=_pointers(params),
                training=m.training,
                recipe=recipe,
            )
        )

    def autocast() -> contextlib.AbstractContextManager[None]:
        return fp8_autocast(recipe, enabled=recipe is not None)

    # Warm-up, eagerly on a side stream (as torch's): GEMM plans, caches, lazily made state.
    # Gradient-accumulation fusion adds the warm-up's weight gradients into main_grad: keep
    # the caller's values and put them back afterwards.
    kept = [
        (p, p.main_grad.clone())
        for st in states
        for p in st.params
        if isinstance(getattr(p, "main_grad", None), torch.Tensor)
    ]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for m, args, first, st in zip(mods, args_list, firsts, states, strict=True):
            for _ in range(num_warmup_iters):
                with autocast():
                    outs, _ = _flat_outputs(_run(m, args, first), st.name)
                _backward_once(outs, args, st.params, create=None)
                # Its graph (and the side stream's accumulation nodes) must not reach the
                # capture (NOTE [graphed layers]).
                del outs
    torch.cuda.synchronize()
    for p, value in kept:
        p.main_grad.copy_(value)
    del kept

    # Forwards in order, then backwards in reverse, into one pool.
    for m, args, first, st in zip(mods, args_list, firsts, states, strict=True):
        with st.fwd.capture(), autocast():
            outs, st.output_is_tensor = _flat_outputs(_run(m, args, first), st.name)
        st.outputs = outs
    for st in reversed(states):
        st.grad_outputs = tuple(
            torch.empty_like(o) if o.requires_grad else None for o in st.outputs
        )
        with st.bwd.capture():
            st.grad_inputs = _backward_once(st.outputs, st.inputs, st.params, st.grad_outputs)
        # The static outputs keep their memory but drop the capture's autograd graph: its
        # AccumulateGrad nodes, bound to the capture stream, would otherwise stay the
        # parameters' and receive every later gradient on that stream (extra syncs).
        st.outputs = tuple(o.detach() for o in st.outputs)
    torch.cuda.synchronize()

    for m, st in zip(mods, states, strict=True):
        _install(m, st)
    return mods[0] if single else mods


def _backward_once(
    outputs: tuple[torch.Tensor, ...],
    inputs: tuple[torch.Tensor, ...],
    params: tuple[torch.nn.Parameter, ...],
    create: tuple[torch.Tensor | None, ...] | None,
) -> tuple[torch.Tensor | None, ...]:
    """Gradients of ``outputs`` (with ``create`` as their gradients, or fresh ones) with respect
    to the inputs that require grad and ``params``; None where one gets none."""
    needs = [o for o in outputs if o.requires_grad]
    wrt = [t for t in (*inputs, *params) if t.requires_grad]
    if not needs or not wrt:
        return tuple(None for _ in (*inputs, *params))
    if create is None:  # warm-up: zeros, so no FP8 amax history records a made-up gradient
        grads_out = [torch.zeros_like(o) for o in needs]
    else:
        grads_out = [g for g in create if g is not None]
    got = torch.autograd.grad(needs, wrt, grads_out, allow_unused=True)
    it = iter(got)
    return tuple(next(it) if t.requires_grad else None for t in (*inputs, *params))


class _Replay(torch.autograd.Function):
    """One replay of a module's forward graph; its backward replays the backward graph. One
    class for every graphed module (a class per module would tie the graphs' lifetime to the
    garbage collector: classes sit in reference cycles)."""

    @staticmethod
    def forward(ctx: Any, st: _Captured, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for static, given in zip(st.inputs, tensors[: len(st.inputs)], strict=True):
            if static.data_ptr() != given.data_ptr():
                static.copy_(given)
        st.fwd.replay()
        st.in_flight = weakref.ref(ctx)
        ctx.st = st
        return tuple(o.detach().clone() for o in st.outputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        st: _Captured = ctx.st
        for static, g in zip(st.grad_outputs, grads, strict=True):
            if static is None:
                continue
            if g is None:
                static.zero_()
            elif static.data_ptr() != g.data_ptr():
                static.copy_(g)
        st.bwd.replay()
        st.in_flight = None
        n = len(st.inputs)
        inputs = (None if g is None else g.detach().clone() for g in st.grad_inputs[:n])
        # The static tensors themselves: this object keeps a reference, so AccumulateGrad
        # copies or adds them and never adopts them (NOTE [graphed layers]).
        params = st.grad_inputs[n:]
        return (None, *inputs, *params)


def _install(module: torch.nn.Module, st: _Captured) -> None:
    # The new forward holds the module weakly: the module holds its graphs (through
    # ``_overlap_graphed``), so module and graphs go together when the module is freed.
    eager = type(module).forward
    ref = weakref.ref(module)

    def forward(*args: Any, **kwargs: Any) -> Any:
        m = ref()
        if m is None:
            raise StateError(f"{st.name}: the graphed module was freed")
        unknown = set(kwargs) - {"is_first_microbatch"}
        if unknown:
            raise InvalidArgumentError(
                f"{st.name} is graphed: keyword arguments {sorted(unknown)} cannot be replayed "
                "(only is_first_microbatch, which every replay treats as True)"
            )
        if m.training != st.training or not torch.is_grad_enabled():
            return eager(m, *args, **kwargs)
        _check_replay(st, m, args)
        out = _Replay.apply(st, *args, *st.params)
        return out[0] if st.output_is_tensor else out

    # The graphs read and write the FP8 quantizers' and cached weights' tensors: an eager call
    # with another recipe replaces a layer's FP8 state, which must not free them.
    st.keep = tuple(getattr(m, "_fp8", None) for m in module.modules())
    module.forward = forward  # type: ignore[method-assign]
    module._overlap_graphed = st  # type: ignore[assignment]


def _pointers(params: tuple[torch.nn.Parameter, ...]) -> tuple[tuple[int, int], ...]:
    """Each parameter's address and its ``main_grad``'s (0 without one): what the graphs
    read and write."""
    out = []
    for p in params:
        mg = getattr(p, "main_grad", None)
        out.append((p.data_ptr(), mg.data_ptr() if isinstance(mg, torch.Tensor) else 0))
    return tuple(out)


def _check_replay(st: _Captured, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    """Typed errors for a call the graphs cannot replay correctly, before any GPU work."""
    if len(args) != len(st.inputs):
        raise InvalidArgumentError(
            f"{st.name} is graphed with {len(st.inputs)} positional tensors, got {len(args)}"
        )
    for i, (static, given) in enumerate(zip(st.inputs, args, strict=True)):
        if not isinstance(given, torch.Tensor):
            raise InvalidArgumentError(
                f"{st.name} is graphed: argument {i} must be a torch.Tensor, got "
                f"{type(given).__name__}"
            )
        if (given.shape, given.dtype, given.device) != (static.shape, static.dtype, static.device):
            raise InvalidArgumentError(
                f"{st.name} is graphed for argument {i} of shape {list(static.shape)}, "
                f"{static.dtype} on {static.device}; got {list(given.shape)}, {given.dtype} on "
                f"{given.device} (capture another graph for that shape, or run the module "
                "eagerly)"
            )
    active = _fp8.fp8_recipe()
    if active is not None and active != st.recipe:
        raise ConfigError(
            f"{st.name} was graphed with FP8 recipe {st.recipe!r}; the enclosing fp8_autocast "
            f"asks for {active!r} (a graph replays the recipe it captured)"
        )
    if _pointers(tuple(p for p in module.parameters() if p.requires_grad)) != st.param_ptrs:
        raise StateError(
            f"{st.name}: a parameter (or its main_grad) was replaced by another tensor since the "
            "graphs were captured, and a replay would use the old one; update them in place "
            "(load_state_dict, optimizers, zeroing main_grad) or graph the module again"
        )
    pending = st.in_flight() if st.in_flight is not None else None
    if pending is not None:
        raise StateError(
            f"{st.name}: forward replayed while the backward of its previous forward has not "
            "run; the graph's saved activations would be overwritten and that backward would "
            "return wrong gradients. Run the backward first (or drop the earlier output), or "
            "graph one copy of the module per micro-batch in flight"
        )


def release_graphs(modules: torch.nn.Module | Sequence[torch.nn.Module]) -> None:
    """Free the CUDA graphs of every graphed module in ``modules`` (and their submodules) and
    make them run eagerly again (NOTE [graph teardown]).

    Call it before ``torch.distributed.destroy_process_group()``: NCCL's teardown waits for
    every graph that captured one of its collectives. The modules may be graphed again
    afterwards. Modules that are not graphed are left as they are.

    Args:
        modules: a module (e.g. the whole model) or a list or tuple of modules.

    Raises:
        InvalidArgumentError: ``modules`` is not a module or a list or tuple of them.
        StateError: a graphed module's forward was replayed and its backward has not run yet
            (its graphs are still needed); nothing is released then.
    """
    if isinstance(modules, torch.nn.Module):
        roots: list[torch.nn.Module] = [modules]
    elif isinstance(modules, (list, tuple)) and all(
        isinstance(m, torch.nn.Module) for m in modules
    ):
        roots = list(modules)
    else:
        raise InvalidArgumentError(
            "release_graphs: modules must be a torch.nn.Module or a list or tuple of them, got "
            f"{type(modules).__name__}"
        )
    graphed: dict[int, torch.nn.Module] = {}
    for root in roots:
        for sub in root.modules():
            if getattr(sub, "_overlap_graphed", None) is not None:
                graphed[id(sub)] = sub
    for sub in graphed.values():  # check all before releasing any
        st: _Captured = sub._overlap_graphed  # type: ignore[assignment]
        if st.in_flight is not None and st.in_flight() is not None:
            raise StateError(
                f"release_graphs: {st.name}'s forward was replayed and its backward has not run; "
                "run the backward (or drop that output) first"
            )
    for sub in graphed.values():
        st = sub._overlap_graphed  # type: ignore[assignment]
        del sub.forward  # the instance attribute _install set: the class's eager forward again
        sub._overlap_graphed = None  # type: ignore[assignment]
        st.fwd.reset()
        st.bwd.reset()
        st.outputs = st.grad_outputs = st.grad_inputs = st.keep = ()
