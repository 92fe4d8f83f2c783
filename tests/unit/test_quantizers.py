"""Quantizers on CPU tensors (host references): round trips of every format against an
independent float64 reader, bit-exact agreement with the pure-torch references, delayed
scaling history, amax groups shared by simulated shards, pickling, validation."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from overlap.comm.bootstrap import Bootstrap  # noqa: E402
from overlap.errors import ConfigError, InvalidArgumentError  # noqa: E402
from overlap.quantization import (  # noqa: E402
    AmaxComputeAlgo,
    BlockScalingConfig,
    BlockScalingQuantizer,
    BootstrapAmaxReducer,
    CallableAmaxReducer,
    CurrentScalingConfig,
    CurrentScalingQuantizer,
    DelayedScalingConfig,
    DelayedScalingQuantizer,
    DirectionFormat,
    Fp8Format,
    HighPrecisionConfig,
    HighPrecisionQuantizer,
    HybridConfig,
    HybridQuantizer,
    MXFP8Config,
    MXFP8Quantizer,
    ProcessGroupAmaxReducer,
    QuantizedTensor,
    ScalingMode,
    as_amax_reducer,
    make_quantizer,
)
from tests.unit.fp8_reference import (  # noqa: E402
    bits,
    fp8_bits,
    ids,
    quantize_blocks,
    quantize_mx,
    scale_from_amax,
)
from tests.unit.quantizer_cases import (  # noqa: E402
    IN_DTYPES,
    QUANTIZERS,
    assert_within_fp8_error,
    cases,
    quantize_primed,
    random_nd,
    shape_id,
)

# ---- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shape"), cases(), ids=lambda v: v if isinstance(v, str) else shape_id(v)
)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
def test_round_trip_every_format(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    q = QUANTIZERS[name][0]()
    x = random_nd(shape, dtype, seed=len(name) * 31 + sum(shape))
    t = quantize_primed(q, x)
    t._validate()  # NOTE [quantizer outputs]: built unvalidated, valid by construction
    assert t.shape == tuple(x.shape) and t.dtype == dtype
    assert t.formats == q.formats and t.has_rowwise and t.has_columnwise
    for col in (False, True):
        assert_within_fp8_error(t, x, columnwise=col)
    default = t.dequantize()
    assert default.dtype == dtype and default.shape == x.shape and default.is_contiguous()


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize(("row", "col"), [(True, False), (False, True)], ids=["row", "col"])
def test_single_direction(name: str, row: bool, col: bool) -> None:
    q = QUANTIZERS[name][0]()
    q.set_usage(rowwise=row, columnwise=col)
    x = random_nd((64, 96), torch.float32, seed=5)
    t = quantize_primed(q, x)
    t._validate()  # NOTE [quantizer outputs]
    assert (t.has_rowwise, t.has_columnwise) == (row, col)
    assert_within_fp8_error(t, x, columnwise=col)
    with pytest.raises(
        InvalidArgumentError, match=f"holds no {'rowwise' if col else 'columnwise'}"
    ):
        t.dequantize(columnwise=row)
    # Per-call override, without touching the quantizer's flags.
    t2 = quantize_primed(q, x, rowwise=True, columnwise=True)
    t2._validate()
    assert t2.has_rowwise and t2.has_columnwise
    assert (q.rowwise_usage, q.columnwise_usage) == (row, col)


def test_non_contiguous_input() -> None:
    x = random_nd((96, 64), torch.float32, seed=2).t()  # [64, 96], strided
    t = CurrentScalingQuantizer().quantize(x)
    assert_within_fp8_error(t, x, columnwise=False)
    assert_within_fp8_error(t, x, columnwise=True)


# ---- bit-exact against the pure-torch references ---------------------------------------------


@pytest.mark.parametrize("fmt", [Fp8Format.E4M3, Fp8Format.E5M2], ids=lambda f: f.value)
@pytest.mark.parametrize("margin", [0, 3])
def test_current_scaling_bits(fmt: Fp8Format, margin: int) -> None:
    x = random_nd((7, 3, 129), torch.bfloat16, seed=margin)
    q = CurrentScalingQuantizer(CurrentScalingConfig(fp8=fmt, margin=margin, epsilon=1e-3))
    t = q.quantize(x)
    x2 = x.float().reshape(21, 129)
    scale = scale_from_amax(x2.abs().max().reshape(1), fmt.torch_dtype, margin=margin, eps=1e-3)
    want = fp8_bits(x2 * scale, fmt.torch_dtype)
    assert torch.equal(bits(t.rowwise_data), want)
    assert torch.equal(bits(t.columnwise_data), want.t())
    assert torch.equal(t.rowwise_scale_inv, 1.0 / scale)
    assert t.columnwise_scale_inv is t.rowwise_scale_inv  # one scale_inv for both directions


@pytest.mark.parametrize("block", [ScalingMode.BLOCK_1X128, ScalingMode.BLOCK_128X128])
@pytest.mark.parametrize("power_of_2", [False, True], ids=["exact", "pow2"])
def test_block_scaling_bits(block: ScalingMode, power_of_2: bool) -> None:
    x = random_nd((130, 257), torch.float16, seed=9)
    cfg = BlockScalingConfig(fp8="e4m3", block=block, power_of_2=power_of_2, epsilon=1e-4)
    t = BlockScalingQuantizer(cfg).quantize(x)
    br = 1 if block is ScalingMode.BLOCK_1X128 else 128
    kw: dict[str, Any] = {"power_of_2": power_of_2, "eps": 1e-4}
    q, s_inv = quantize_blocks(x, br, 128, torch.float8_e4m3fn, **kw)
    q_t, s_inv_t = quantize_blocks(x.t(), br, 128, torch.float8_e4m3fn, **kw)
    assert torch.equal(bits(t.rowwise_data), q) and torch.equal(t.rowwise_scale_inv, s_inv)
    assert torch.equal(bits(t.columnwise_data), q_t)
    assert torch.equal(t.columnwise_scale_inv, s_inv_t)


def test_mxfp8_bits() -> None:
    x = random_nd((64, 96), torch.float32, seed=4)
    t = MXFP8Quantizer(MXFP8Config(fp8=torch.float8_e5m2)).quantize(x)
    q, s = quantize_mx(x, 1, 32, torch.float8_e5m2)
    q_c, s_c = quantize_mx(x, 32, 1, torch.float8_e5m2)
    assert torch.equal(bits(t.rowwise_data), q) and torch.equal(t.rowwise_scale_inv, s)
    assert torch.equal(bits(t.columnwise_data), q_c) and torch.equal(t.columnwise_scale_inv, s_c)


def test_hybrid_directions_come_from_their_quantizers() -> None:
    x = random_nd((130, 257), torch.bfloat16, seed=8)
    row_q, col_q = CurrentScalingQuantizer(), BlockScalingQuantizer(rowwise=False)
    hybrid = HybridQuantizer(row_q, col_q)
    t = hybrid.quantize(x)
    assert t.rowwise_format == DirectionFormat(ScalingMode.TENSOR, Fp8Format.E4M3)
    assert t.columnwise_format == DirectionFormat(ScalingMode.BLOCK_1X128, "e4m3")
    alone_row = CurrentScalingQuantizer().quantize(x, columnwise=False)
    alone_col = BlockScalingQuantizer().quantize(x, rowwise=False)
    assert torch.equal(bits(t.rowwise_data), bits(alone_row.rowwise_data))
    assert torch.equal(t.rowwise_scale_inv, alone_row.rowwise_scale_inv)
    assert torch.equal(bits(t.columnwise_data), bits(alone_col.columnwise_data))
    assert torch.equal(t.columnwise_scale_inv, alone_col.columnwise_scale_inv)
    # The sub-quantizers' own usage flags are neither consulted nor changed.
    assert (col_q.rowwise_usage, col_q.columnwise_usage) == (False, True)
    assert hybrid.uses_amax_group and not HybridQuantizer(col_q, MXFP8Quantizer()).uses_amax_group


def test_make_quantizer_from_configs() -> None:
    q = make_quantizer(HybridConfig(CurrentScalingConfig(), MXFP8Config()), columnwise=False)
    assert isinstance(q, HybridQuantizer) and not q.columnwise_usage
    assert isinstance(q.columnwise_quantizer, MXFP8Quantizer)
    assert isinstance(make_quantizer(DelayedScalingConfig()), DelayedScalingQuantizer)
    with pytest.raises(ConfigError, match="is not a quantizer config"):
        make_quantizer({"fp8": "e4m3"})


# ---- delayed scaling -------------------------------------------------------------------------


@pytest.mark.parametrize("algo", list(AmaxComputeAlgo), ids=lambda a: a.value)
def test_delayed_scaling_history(algo: AmaxComputeAlgo) -> None:
    cfg = DelayedScalingConfig(fp8="e4m3", margin=1, history_len=3, amax_compute_algo=algo)
    q = DelayedScalingQuantizer(cfg)
    base = random_nd((16, 48), torch.float32, seed=1)
    base = base / base.abs().max()  # amax 1
    amaxes = [2.0, 8.0, 0.5, 1.0, 0.25]
    history: list[float] = [0.0, 0.0, 0.0]
    scale = torch.ones(1)
    tensors = []
    for a in amaxes:
        x = base * a
        t = q.quantize(x)
        # The cast used the scale from the earlier calls ...
        assert torch.equal(t.rowwise_scale_inv, 1.0 / scale)
        assert torch.equal(bits(t.rowwise_data), fp8_bits(x * scale, torch.float8_e4m3fn))
        tensors.append((t, t.rowwise_scale_inv.clone(), x))
        # ... and then recorded this call's amax and computed the next scale.
        history = [a, *history[:-1]]
        assert q.amax_history.tolist() == history
        ref = max(history) if algo is AmaxComputeAlgo.MAX else history[0]
        scale = scale_from_amax(torch.tensor([ref]), torch.float8_e4m3fn, margin=1)
        assert torch.equal(q.scale, scale)
    # Later calls never changed an earlier tensor's scale_inv (invariant 1).
    for t, s_inv, _ in tensors:
        assert torch.equal(t.rowwise_scale_inv, s_inv)
        assert t.rowwise_scale_inv.data_ptr() != q.scale.data_ptr()
    q.reset()
    assert q.amax_history.abs().sum() == 0 and q.scale.item() == 1.0


# ---- amax groups -----------------------------------------------------------------------------


class ThreadGroup:
    """n simulated ranks in threads of one process; a collective exchanges through a barrier."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.slots: list[Any] = [None] * n
        self.barrier = threading.Barrier(n, timeout=30)
        self.calls = 0

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self.slots[rank] = value
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before all have read
        if rank == 0:
            self.calls += 1
        return got

    def run(self, fn: Any) -> list[Any]:
        """``fn(rank)`` on every rank, in threads; results by rank (exceptions re-raised)."""
        results: list[Any] = [None] * self.n

        def body(r: int) -> None:
            try:
                results[r] = fn(r)
            except BaseException as e:
                results[r] = e
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results


class ThreadReducer:
    """An AmaxReducer for one rank of a ThreadGroup."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank = group, rank

    def all_reduce_max(self, amax: torch.Tensor) -> None:
        values = self.group.exchange(self.rank, amax.clone())
        amax.copy_(torch.stack(values).amax(dim=0))


class ThreadBootstrap(Bootstrap):
    """An overlap Bootstrap over a ThreadGroup."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.size = group, rank, group.n

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return self.group.exchange(self.rank, bytes(data))

    def split(self, color: int, key: int) -> Bootstrap:
        raise AssertionError("not used")


def _shards(n: int) -> list[torch.Tensor]:
    # Very different magnitudes per shard: local scales would differ by orders of magnitude.
    return [random_nd((24, 256), torch.bfloat16, seed=s) * 4.0 ** (3 * s) for s in range(n)]


@pytest.mark.parametrize(
    "make",
    [
        CurrentScalingQuantizer,
        lambda: DelayedScalingQuantizer(DelayedScalingConfig(history_len=2)),
        lambda: HybridQuantizer(CurrentScalingQuantizer(), BlockScalingQuantizer()),
    ],
    ids=["current", "delayed", "hybrid"],
)
@pytest.mark.parametrize("adapter", ["reducer", "bootstrap"])
def test_amax_group_gives_shards_one_scale(make: Any, adapter: str) -> None:
    n = 3
    shards = _shards(n)
    whole = torch.cat(shards)
    group = ThreadGroup(n)
    quantizers = [make() for _ in range(n)]

    def rank_fn(r: int) -> QuantizedTensor:
        g = ThreadReducer(group, r) if adapter == "reducer" else ThreadBootstrap(group, r)
        return quantize_primed(quantizers[r], shards[r], amax_group=g)

    results = group.run(rank_fn)
    assert group.calls >= 1
    scale_invs = [t.rowwise_scale_inv for t in results]
    assert all(torch.equal(s, scale_invs[0]) for s in scale_invs)
    # One scale for all: the gathered FP8 rows are those of quantizing the whole tensor.
    reference = quantize_primed(make(), whole)
    gathered = torch.cat([bits(t.rowwise_data) for t in results])
    assert torch.equal(gathered, bits(reference.rowwise_data))
    assert torch.equal(scale_invs[0], reference.rowwise_scale_inv)
    deq = torch.cat([t.dequantize(dtype=torch.float32) for t in results])
    assert_within_fp8_error(reference, whole, columnwise=False)
    assert torch.equal(deq, reference.dequantize(dtype=torch.float32))
    for t, x in zip(results, shards, strict=True):
        assert_within_fp8_error(t, x, columnwise=True)


def test_without_group_shards_get_their_own_scales() -> None:
    """The control of the test above: without a group, the scales differ."""
    ts = [CurrentScalingQuantizer().quantize(x) for x in _shards(2)]
    assert not torch.equal(ts[0].rowwise_scale_inv, ts[1].rowwise_scale_inv)


def test_block_formats_ignore_the_group() -> None:
    calls: list[torch.Tensor] = []
    group = CallableAmaxReducer(calls.append)
    x = random_nd((32, 256), torch.float32, seed=3)
    for q in (BlockScalingQuantizer(), MXFP8Quantizer(), HighPrecisionQuantizer()):
        assert not q.uses_amax_group
        q.quantize(x, amax_group=group)
    assert calls == []
    CurrentScalingQuantizer().quantize(x, amax_group=group)
    assert len(calls) == 1


def test_process_group_reducer_with_gloo() -> None:
    """A real torch.distributed all-reduce (gloo, 2 ranks in threads of this process)."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    store = dist.HashStore()
    group = ThreadGroup(2)
    shards = _shards(2)

    def rank_fn(r: int) -> QuantizedTensor:
        # A ProcessGroup of 2 ranks without init_process_group (no global state).
        pg = dist.ProcessGroup(store, r, 2)
        gloo = dist.ProcessGroupGloo(store, r, 2)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
        pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        reducer = as_amax_reducer(pg)
        assert isinstance(reducer, ProcessGroupAmaxReducer)
        return CurrentScalingQuantizer().quantize(shards[r], amax_group=reducer)

    results = group.run(rank_fn)
    whole = CurrentScalingQuantizer().quantize(torch.cat(shards))
    for t in results:
        assert torch.equal(t.rowwise_scale_inv, whole.rowwise_scale_inv)


def test_callable_and_bootstrap_adapters() -> None:
    amax = torch.tensor([2.0])
    as_amax_reducer(lambda a: a * 3).all_reduce_max(amax)
    assert amax.item() == 6.0
    as_amax_reducer(lambda a: a.mul_(2)).all_reduce_max(amax)
    assert amax.item() == 12.0

    class Peers(Bootstrap):
        rank, size = 0, 3

        def allgather_bytes(self, data: bytes) -> list[bytes]:
            other = [torch.tensor([20.0]), torch.tensor([float("nan")])]
            return [data, *(o.numpy().tobytes() for o in other)]

        def split(self, color: int, key: int) -> Bootstrap:
            raise AssertionError

    reducer = as_amax_reducer(Peers())
    assert isinstance(reducer, BootstrapAmaxReducer)
    reducer.all_reduce_max(amax)
    assert torch.isnan(amax).all()  # a NaN on any rank wins
    with pytest.raises(InvalidArgumentError, match="must have an all_reduce_max"):
        CurrentScalingQuantizer().quantize(torch.ones(4, 4), amax_group=42)


# ---- plain objects: pickle, deepcopy, no group reachable -------------------------------------


class _UnpicklableGroup:
    """Stands for a ProcessGroup / communicator: cannot be pickled or deep-copied."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen = 0

    def all_reduce_max(self, amax: torch.Tensor) -> None:
        self.seen += 1

    def __reduce__(self) -> Any:
        raise TypeError("a process group cannot be pickled")


def _reachable(root: object, limit: int = 100000) -> list[object]:
    """Every object reachable from ``root`` through the garbage collector's referents."""
    seen: dict[int, object] = {}
    stack = [root]
    while stack and len(seen) < limit:
        o = stack.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        seen[id(o)] = o
        stack.extend(gc.get_referents(o))
    return list(seen.values())


def _same_quantizer(a: Any, b: Any) -> None:
    assert type(a) is type(b) and a.config == b.config and a.formats == b.formats
    assert (a.rowwise_usage, a.columnwise_usage) == (b.rowwise_usage, b.columnwise_usage)
    for attr in ("amax_history", "scale"):
        if hasattr(a, attr):
            assert torch.equal(getattr(a, attr), getattr(b, attr))


def _same_tensor(a: QuantizedTensor, b: QuantizedTensor) -> None:
    assert a.meta == b.meta and (a.has_rowwise, a.has_columnwise) == (
        b.has_rowwise,
        b.has_columnwise,
    )
    for ta, tb in zip(a.tensors(), b.tensors(), strict=True):
        assert (ta is None) == (tb is None)
        if ta is not None:
            assert ta.dtype == tb.dtype and torch.equal(ta.view(torch.uint8), tb.view(torch.uint8))


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_pickle_and_deepcopy_keep_no_group(name: str) -> None:
    q = QUANTIZERS[name][0]()
    group = _UnpicklableGroup()
    shape = (64, 96)
    x = random_nd(shape, torch.bfloat16, seed=6)
    t = quantize_primed(q, x, amax_group=group)
    assert group.seen == (2 if "delayed" in name else 1) * int(q.uses_amax_group)
    for obj in (q, t):
        assert not any(o is group for o in _reachable(obj)), f"{type(obj).__name__} keeps the group"
    for clone in (pickle.loads(pickle.dumps(q)), copy.deepcopy(q), q.copy()):
        _same_quantizer(q, clone)
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    for clone in (
        pickle.loads(pickle.dumps(t)),
        copy.deepcopy(t),
        torch.load(buf, weights_only=False),
    ):
        _same_tensor(t, clone)
        assert torch.equal(clone.dequantize(), t.dequantize())
    # A deep copy is independent: quantizing with it leaves the original's state alone.
    dup = copy.deepcopy(q)
    dup.quantize(x * 100)
    if isinstance(q, DelayedScalingQuantizer):
        assert not torch.equal(dup.amax_history, q.amax_history)


# ---- validation ------------------------------------------------------------------------------

BAD_CONFIGS = {
    "margin": (lambda: CurrentScalingConfig(margin=-1), r"margin must be an int in \[0, 127\]"),
    "margin-float": (lambda: DelayedScalingConfig(margin=1.5), "margin must be an int"),
    "history": (lambda: DelayedScalingConfig(history_len=0), "history_len must be an int"),
    "algo": (
        lambda: DelayedScalingConfig(amax_compute_algo="mean"),
        r"amax_compute_algo must be one of \['max', 'most_recent'\]",
    ),
    "fp8": (lambda: MXFP8Config(fp8="e3m4"), "unknown FP8 format 'e3m4'"),
    "fp8-dtype": (lambda: CurrentScalingConfig(fp8=torch.float16), "unknown FP8 format"),
    "epsilon": (
        lambda: BlockScalingConfig(epsilon=float("nan")),
        "epsilon must be a finite float >= 0",
    ),
    "block": (
        lambda: BlockScalingConfig(block=ScalingMode.TENSOR),
        "block must be ScalingMode.BLOCK_1X128 or ScalingMode.BLOCK_128X128",
    ),
    "block-str": (lambda: BlockScalingConfig(block="2x2"), "block must be one of"),
    "hp-dtype": (
        lambda: HighPrecisionConfig(dtype=torch.int32),
        "HighPrecisionConfig.dtype must be",
    ),
    "hybrid-nested": (
        lambda: HybridConfig(HybridConfig(), MXFP8Config()),
        "cannot itself be a HybridConfig",
    ),
    "hybrid-type": (lambda: HybridConfig("e4m3", MXFP8Config()), "HybridConfig.rowwise must be"),
    "hybrid-quantizer": (
        lambda: HybridQuantizer(
            HybridQuantizer(MXFP8Quantizer(), MXFP8Quantizer()), MXFP8Quantizer()
        ),
        "rowwise_quantizer must be a non-hybrid Quantizer",
    ),
    "wrong-config": (
        lambda: CurrentScalingQuantizer(BlockScalingConfig()),
        "CurrentScalingQuantizer takes a CurrentScalingConfig",
    ),
    "no-usage": (
        lambda: MXFP8Quantizer(rowwise=False, columnwise=False),
        "at least one of rowwise / columnwise usage must be True",
    ),
    "format-mismatch": (
        lambda: DirectionFormat(ScalingMode.TENSOR),
        "mode and fp8 are both set",
    ),
    "format-direction": (
        lambda: DirectionFormat(ScalingMode.MXFP8_COLUMNWISE, "e4m3").check_direction(False),
        "MXFP8_COLUMNWISE cannot be the rowwise format",
    ),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_config_validation(name: str) -> None:
    make, match = BAD_CONFIGS[name]
    with pytest.raises(ConfigError, match=match):
        make()


def test_configs_are_frozen_and_normalised() -> None:
    cfg = DelayedScalingConfig(fp8=torch.float8_e5m2, amax_compute_algo="most_recent")
    assert cfg.fp8 is Fp8Format.E5M2 and cfg.amax_compute_algo is AmaxComputeAlgo.MOST_RECENT
    assert BlockScalingConfig(block="block_128x128").block is ScalingMode.BLOCK_128X128
    with pytest.raises(AttributeError):
        cfg.margin = 3  # type: ignore[misc]
    assert hash(cfg) == hash(DelayedScalingConfig(fp8="E5M2", amax_compute_algo="most_recent"))


def _out_for(q: Any, shape: tuple[int, ...], **kw: bool) -> QuantizedTensor:
    return q.quantize(torch.randn(shape), **kw)


BAD_CALLS = {
    "int-input": (
        lambda: CurrentScalingQuantizer().quantize(torch.ones(4, 4, dtype=torch.int32)),
        "expects a float32, bfloat16 or float16 tensor of at least 1 dim, got torch.int32",
    ),
    "scalar": (
        lambda: BlockScalingQuantizer().quantize(torch.tensor(1.0)),
        r"of at least 1 dim, got torch.float32 of shape \[\]",
    ),
    "not-tensor": (lambda: MXFP8Quantizer().quantize([1.0]), "expects a torch.Tensor"),
    "no-direction": (
        lambda: MXFP8Quantizer().quantize(torch.ones(32, 32), rowwise=False, columnwise=False),
        "rowwise and columnwise both False",
    ),
    "mx-ragged": (
        lambda: MXFP8Quantizer().quantize(torch.ones(32, 40)),
        "rowwise MXFP8 uses 1x32 blocks along rows, so cols must be a multiple of 32",
    ),
    "out-format": (
        lambda: CurrentScalingQuantizer().quantize(
            torch.ones(8, 128), out=_out_for(BlockScalingQuantizer(), (8, 128))
        ),
        r"out has formats \('BLOCK_1X128/E4M3', 'BLOCK_1X128/E4M3'\), this quantizer makes "
        r"\('TENSOR/E4M3', 'TENSOR/E4M3'\)",
    ),
    "out-stale-direction": (
        lambda: CurrentScalingQuantizer().quantize(
            torch.ones(8, 128), columnwise=False, out=_out_for(CurrentScalingQuantizer(), (8, 128))
        ),
        "a direction of out that is not rewritten would be stale",
    ),
    "out-shape": (
        lambda: CurrentScalingQuantizer().quantize(
            torch.ones(8, 128), out=_out_for(CurrentScalingQuantizer(), (8, 64))
        ),
        r"out is \[8, 64\] torch.float32 on cpu, x is \[8, 128\]",
    ),
    "out-type": (
        lambda: CurrentScalingQuantizer().quantize(torch.ones(8, 128), out=torch.ones(8, 128)),
        "out must be a QuantizedTensor",
    ),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_call_validation(name: str) -> None:
    call, match = BAD_CALLS[name]
    with pytest.raises(InvalidArgumentError, match=match):
        call()


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantize_into_out_in_place(name: str) -> None:
    q = QUANTIZERS[name][0]()
    x1, x2 = (random_nd((64, 96), torch.float32, seed=s) for s in (1, 2))
    t = quantize_primed(q, x1)
    ptrs = [p.data_ptr() for p in t.tensors() if p is not None]
    for p in t.tensors():  # poison: every byte must be rewritten
        if p is not None:
            p.view(torch.uint8).fill_(0x7F)
    q.quantize(x2)  # prime delayed scaling with x2
    assert q.quantize(x2, out=t) is t
    assert [p.data_ptr() for p in t.tensors() if p is not None] == ptrs
    assert_within_fp8_error(t, x2, columnwise=False)
    assert_within_fp8_error(t, x2, columnwise=True)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_empty_input(name: str) -> None:
    q = QUANTIZERS[name][0]()
    calls: list[int] = []
    group = CallableAmaxReducer(lambda a: calls.append(int(a.item() == 0)))
    t = q.quantize(torch.empty(0, 64), amax_group=group)
    assert t.shape == (0, 64) and t.dequantize().shape == (0, 64)
    assert t.dequantize(columnwise=True).shape == (0, 64)
    # A rank with no tokens still joins the amax reduction (with 0), or the others would hang.
    assert calls == [1] * int(q.uses_amax_group)


def test_quantizers_share_one_format_object_per_value() -> None:
    """direction_format: one frozen object per (mode, fp8), whatever form fp8 takes; the
    quantizers' outputs carry it (the ops' plan keys compare it by identity first)."""
    from overlap.quantization import direction_format

    a = direction_format(ScalingMode.TENSOR, "e4m3")
    assert a is direction_format(ScalingMode.TENSOR, torch.float8_e4m3fn)
    assert a is direction_format(ScalingMode.TENSOR, Fp8Format.E4M3)
    assert a == DirectionFormat(ScalingMode.TENSOR, Fp8Format.E4M3)
    assert direction_format() is direction_format(None, None) == DirectionFormat()
    q = CurrentScalingQuantizer(CurrentScalingConfig())
    t = q.quantize(torch.ones(4, 32))
    assert t.rowwise_format is a and t.columnwise_format is a
    with pytest.raises(ConfigError, match="both set"):
        direction_format(ScalingMode.TENSOR, None)
