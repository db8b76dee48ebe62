"""Placements, SBP and eager global arrays (OneFlow's global view on fflow).

A *placement* names the devices a global array lives on and their hierarchy (a
1-D list of ranks, or an N-D nested list forming a device mesh). An *SBP* gives,
per mesh axis, how the logical array maps onto the devices of that axis:

* `split(k)` (short `S(k)`): each device holds a balanced slice along dim `k`
  (the first `n mod p` slices are one element longer);
* `broadcast` (`B`): each device holds the whole array;
* `partial_sum` (`P`), `partial_max`, `partial_min`: each device holds an array of
  the full shape and the logical value is their sum / max / min.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> pl = fflow.placement("cpu", [0, 1])
    >>> x = fflow.to_global(jnp.arange(6.0), pl, fflow.sbp.split(0))
    >>> [a.tolist() for a in x.to_local_shards()]
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    >>> y = (x * 2).to_global(sbp=fflow.sbp.broadcast)
    >>> y.sbp, y.tolist()
    ((B,), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
"""

import os
import time

import numpy as np

# The SBP values and shard layout live in fflow/sbp.py (below the primitives); they
# are re-exported here for older import paths: import them from fflow.sbp.
from fflow import core, sbp  # noqa: F401
from fflow.api_util import as_value
from fflow.array import Array
from fflow.config import config
from fflow.device_profile import (  # noqa: F401
    CPU,
    CPU_MPI,
    H200,
    DeviceProfile,
    best_time,
    default_profile,
)
from fflow.errors import ShapeError, user_error
from fflow.primitives.sbp_constraint import constrain
from fflow.sbp import (  # noqa: F401
    B,
    Broadcast,
    P,
    Partial,
    S,
    SbpParallel,
    Split,
    _fits,
    as_nd_sbp,
    assemble,
    balanced,
    broadcast,
    canonical,
    check_sbp_fits,
    group_coord,
    local_box,
    local_piece,
    local_shape,
    partial_identity,
    partial_keeper,
    partial_max,
    partial_min,
    partial_sum,
    piece_bounds,
    reduce_fn,
    scatter_global,
    split,
)

# ----------------------------------------------------------------------------
# Placement


def num_cpu_devices():
    """How many simulated CPU devices exist: FFLOW_NUM_CPU_DEVICES if set, else
    `fflow.config.cpu_devices` (FFLOW_CPU_DEVICES, default 8)."""
    env = os.environ.get("FFLOW_NUM_CPU_DEVICES")
    if env:
        return int(env)
    return int(config.cpu_devices)


class placement:  # noqa: N801  (named as in OneFlow: flow.placement)
    """The devices of a global array and their hierarchy (a device mesh).

    Args:
        type: device type, "cpu" (simulated devices or MPI ranks) or "cuda".
        ranks: a list of ranks (1-D), a nested list (an N-D mesh, e.g. `[[0, 1], [2, 3]]`)
            or an int `n` meaning `range(n)`.

    Example:
        >>> import fflow
        >>> p = fflow.placement("cpu", [[0, 1], [2, 3]])
        >>> p.hierarchy, p.ranks
        ((2, 2), (0, 1, 2, 3))
    """

    __slots__ = ("type", "hierarchy", "ranks", "_hash")

    def __init__(self, type="cpu", ranks=None):  # noqa: A002
        if ranks is None:
            ranks = list(range(device_count()))
        if isinstance(ranks, (int, np.integer)):
            ranks = list(range(int(ranks)))
        arr = np.asarray(ranks)
        if arr.size == 0 or arr.dtype.kind not in "iu":
            raise user_error(
                ValueError, f"placement ranks must be a non-empty (nested) list of ints: {ranks}"
            )
        flat = tuple(int(r) for r in arr.reshape(-1))
        if len(set(flat)) != len(flat):
            raise user_error(ValueError, f"placement ranks repeat a device: {ranks}")
        self.type = str(type)
        self.hierarchy = tuple(int(d) for d in arr.shape)
        self.ranks = flat
        self._hash = hash((self.type, self.hierarchy, self.ranks))
        limit = device_count()
        bad = [r for r in flat if not 0 <= r < limit]
        if bad:
            raise user_error(
                ValueError,
                f"placement uses device(s) {bad}, but this run has {limit} devices "
                f"({runtime().describe()}). Fix: use ranks below {limit}, or raise the device "
                f"count (FFLOW_NUM_CPU_DEVICES for simulated devices, -n for fflow.launch).",
            )

    @property
    def ndim(self):
        return len(self.hierarchy)

    @property
    def size(self):
        return len(self.ranks)

    def coords(self, index):
        """Mesh coordinates of the device at flat position `index`."""
        return tuple(int(c) for c in np.unravel_index(index, self.hierarchy))

    def index_of(self, coords):
        return int(np.ravel_multi_index(tuple(coords), self.hierarchy))

    def __eq__(self, other):
        return (
            isinstance(other, placement)
            and self.type == other.type
            and self.hierarchy == other.hierarchy
            and self.ranks == other.ranks
        )

    def __hash__(self):
        return self._hash

    def __repr__(self):
        ranks = np.asarray(self.ranks).reshape(self.hierarchy).tolist()
        return f"placement(type={self.type!r}, ranks={ranks})"

    def __reduce__(self):
        return (placement, (self.type, np.asarray(self.ranks).reshape(self.hierarchy).tolist()))


def device_count():
    return runtime().device_count()


# ----------------------------------------------------------------------------
# Runtimes

_runtime = None

# The runtimes (simulated devices, MPI ranks, NCCL) run sharded programs, so they sit
# above this module (runtime_sim.py, runtime_mpi.py, lowering/cuda_nccl.py import it);
# fflow/__init__ installs the factory that picks one from FFLOW_RUNTIME and loads it
# on first use. So do the other hooks below: eager boxing and moves of global arrays.
runtime_factories = []


def runtime():
    """The runtime executing global arrays: MPI under `fflow.launch`, else simulated."""
    global _runtime
    if _runtime is None:
        _runtime = runtime_factories[0](os.environ.get("FFLOW_RUNTIME", "").lower())
    return _runtime


def set_runtime(rt):
    """Install a runtime (tests use this to switch device counts)."""
    global _runtime
    _runtime = rt


# ----------------------------------------------------------------------------
# Eager global arrays


class Sharding:
    """The hashable (placement, sbp) pair of a global array."""

    __slots__ = ("placement", "sbp", "_hash")

    def __init__(self, placement, sbp):
        self.placement = placement
        self.sbp = tuple(sbp)
        self._hash = hash((placement, self.sbp))

    def __eq__(self, other):
        return (
            type(other) is Sharding and other.placement == self.placement and other.sbp == self.sbp
        )

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"Sharding({self.placement}, {self.sbp})"

    def __reduce__(self):
        return (Sharding, (self.placement, self.sbp))


class GlobalValue:
    """The `_value` of a global Array: logical shape/dtype plus this process' shards.

    `shards` maps a flat placement index to the local NumPy array of that device
    (all of them on simulated devices, this rank's one under MPI).
    """

    __slots__ = ("shape", "dtype", "sharding", "shards")

    def __init__(self, shape, dtype, sharding, shards):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.sharding = sharding
        self.shards = shards

    @classmethod
    def of(cls, shape, dtype, sharding, shards):
        """`GlobalValue(...)` for a tuple `shape` and an `np.dtype` as they are (no
        conversions: the per-call path of sharded programs)."""
        gv = object.__new__(cls)
        gv.shape, gv.dtype, gv.sharding, gv.shards = shape, dtype, sharding, shards
        return gv

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __array__(self, dtype=None, copy=None):
        value = runtime().assemble(self)
        return value if dtype is None else value.astype(dtype)

    # Python scalars of a 0-d global array (Array's conversions delegate here)
    def __float__(self):
        return float(np.asarray(self))

    def __int__(self):
        return int(np.asarray(self))

    def __bool__(self):
        return bool(np.asarray(self))

    def __complex__(self):
        return complex(np.asarray(self))

    def __index__(self):
        return int(np.asarray(self))


def make_global(shape, dtype, pl, nd_sbp, shards, weak_type=False):
    sharding = Sharding(pl, nd_sbp)
    out = Array(GlobalValue(shape, dtype, sharding, shards), weak_type)
    out._sharding = sharding
    return out


def is_global(x):
    return type(x) is Array and x._sharding is not None


# Boxing a global array to another SBP on its placement (a one-equation sharded program,
# transforms/shard_exec.py) and moving it to other devices (point-to-point boxing,
# transforms/shard_transfer.py): hooks fflow/__init__ installs, since both modules
# sit above this one.
boxers = []
placement_movers = []
# A sharded program that moves values to other placements (with_sbp(..., placement=))
# is cut into one sharded program per placement by transforms/shard_mixed.py, through
# this hook (installed by fflow/__init__, so transforms/shard.py does not import it).
program_cutters = []


def to_global(x, placement=None, sbp=None):
    """Make (or re-box) a global array, as OneFlow's `tensor.to_global`.

    A local array becomes a global array whose logical value is `x` (every device
    gets its shard; for partial SBPs the data goes to the first device of each P
    axis). A global array is converted to the new SBP with the cheapest boxing.

    Args:
        x: an array (local or global).
        placement: a `fflow.placement` (defaults to the array's own placement).
        sbp: one SBP or a tuple per mesh axis (defaults to broadcast, or the array's own).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> pl = fflow.placement("cpu", [0, 1])
        >>> x = fflow.to_global(jnp.ones((4, 2)), pl, fflow.sbp.split(0))
        >>> x.shape, x.to_local_shards()[0].shape
        ((4, 2), (2, 2))
    """
    if isinstance(x, core.Tracer):
        if sbp is None:
            raise user_error(ValueError, "to_global of a traced value needs an sbp")
        return constrain(x, sbp)
    if is_global(x):
        src = x._sharding
        pl = src.placement if placement is None else placement
        if pl != src.placement and sbp is None and pl.ndim != src.placement.ndim:
            raise user_error(
                ValueError,
                f"to_global: moving an array from {src.placement} to {pl} (another mesh "
                "shape) needs an sbp for the new placement.",
            )
        target = src.sbp if sbp is None else as_nd_sbp(sbp, pl.ndim, "to_global")
        if pl != src.placement:
            # other devices or mesh: point-to-point sends (transforms/shard_transfer.py)
            check_sbp_fits(x.shape, target, pl.hierarchy, "to_global")
            return placement_movers[0](x, pl, target)
        if pl == src.placement and target == src.sbp:
            return x
        check_sbp_fits(x.shape, target, pl.hierarchy, "to_global")
        return boxers[0](x, pl, target)
    if placement is None:
        raise user_error(ValueError, "to_global of a local array needs a placement")
    target = (B,) * placement.ndim if sbp is None else as_nd_sbp(sbp, placement.ndim, "to_global")
    x = as_value(x)
    value = np.asarray(x)
    check_sbp_fits(value.shape, target, placement.hierarchy, "to_global")
    shards = runtime().scatter(value, target, placement)
    return make_global(value.shape, value.dtype, placement, target, shards, x.weak_type)


def to_local(x):
    """This process' shard of a global array (on simulated devices: device 0's shard).

    `to_local_shards()` returns every simulated device's shard.
    """
    if not is_global(x):
        return x
    return Array(runtime().local_of(x._value))


def to_local_shards(x):
    return [Array(v) for _, v in sorted(x._value.shards.items())]


def local_indices(pl):
    """Flat positions in `pl` of the devices this process holds shards for: all of them
    on simulated devices, this rank's one (or none) under MPI."""
    rt = runtime()
    if hasattr(rt, "comm"):
        return [pl.ranks.index(rt.rank)] if rt.rank in pl.ranks else []
    return list(range(pl.size))


def global_from_shards(shards, shape, pl, sbp, dtype=None):
    """A global array from explicit per-device local arrays (indexed by flat position)."""
    shards = {i: np.asarray(s) for i, s in enumerate(shards)}
    dtype = dtype or next(iter(shards.values())).dtype
    return make_global(shape, dtype, pl, as_nd_sbp(sbp, pl.ndim), shards)


def process_index():
    """This process' rank (0 on simulated devices, where one process holds them all)."""
    return runtime().rank


def process_count():
    """How many processes run this program (MPI ranks; 1 on simulated devices)."""
    rt = runtime()
    return rt.device_count() if hasattr(rt, "world") else 1


def make_global_array(local, placement, sbp):
    """A global array from each process' own shard (no process holds the whole value).

    OneFlow's `to_global` of a local tensor, JAX's `make_array_from_process_local_data`:
    under MPI each rank passes only its shard (for split SBPs) or its partial value
    (for partial SBPs); the global shape follows from the shards. The shards' shapes
    and dtypes are checked across ranks once, so a rank with another batch shape is an
    error naming it, not a silently different result.

    Args:
        local: this process' shard; or a callable `index -> shard` (index = the
            device's flat position in `placement`), which works on both runtimes; on
            simulated devices (one process holds every device) also a list of shards,
            one per device.
        placement: a `fflow.placement`.
        sbp: one SBP or a tuple per mesh axis.

    Example:
        >>> import fflow, numpy as np
        >>> pl = fflow.placement("cpu", [0, 1])
        >>> x = fflow.make_global_array(lambda i: np.full((2, 3), i, np.float32), pl,
        ...                             fflow.sbp.split(0))
        >>> x.shape, np.asarray(x)[:, 0].tolist()
        ((4, 3), [0.0, 0.0, 1.0, 1.0])
    """
    nd = as_nd_sbp(sbp, placement.ndim, "make_global_array")
    rt = runtime()
    if callable(local):
        fn = local
    elif isinstance(local, (list, tuple)):
        if len(local) != placement.size:
            raise user_error(
                ValueError,
                f"make_global_array: got {len(local)} shards for a placement of "
                f"{placement.size} devices; pass one per device (flat order).",
            )
        shards = list(local)
        fn = shards.__getitem__
    else:
        if not hasattr(rt, "world") and placement.size > 1:
            raise user_error(
                ValueError,
                "make_global_array: on simulated devices one process holds every device; "
                "pass a list of shards (one per device) or a callable index -> shard.",
            )
        fn = lambda i: local  # noqa: E731  (this rank's only shard)

    def value(i):
        return np.asarray(fn(i))

    mine = rt.local_shards(placement, value)
    infos = rt.gather_shard_infos(placement, mine)
    shape, dtype = global_shape_of(infos, nd, placement)
    out = make_global(shape, dtype, placement, nd, mine)
    return out


def global_shape_of(infos, nd, pl):
    """The global shape from every device's (local shape, dtype name); a user error
    naming the device (rank) whose shard does not fit the others'."""
    shape0, dtype0 = infos[0]
    infos = [(tuple(shp), dt) for shp, dt in infos]
    for i, (shp, dt) in enumerate(infos):
        if len(shp) != len(shape0) or dt != dtype0:
            _shard_mismatch(pl, i, shp, dt, infos, None, nd)
    glob = []
    for d in range(len(shape0)):
        axes = [m for m, s in enumerate(nd) if s == Split(d) and pl.hierarchy[m] > 1]
        if not axes:  # not split: every device has the same size; blame who differs
            sizes = [shp[d] for shp, _ in infos]
            common = max(sizes, key=lambda v: (sizes.count(v), v == sizes[0]))
            i = next((i for i, v in enumerate(sizes) if v != common), None)
            if i is not None:
                _shard_mismatch(pl, i, infos[i][0], infos[i][1], infos, None, nd)
            glob.append(common)
            continue
        total = 0
        for i in range(pl.size):
            c = pl.coords(i)
            if all(c[m] == 0 for m in range(pl.ndim) if m not in axes):
                total += infos[i][0][d]
        glob.append(total)
    glob = tuple(glob)
    for s in nd:
        if s.is_split() and s.axis >= len(glob):
            check_sbp_fits(glob, nd, pl.hierarchy, "make_global_array")
    for i, (shp, dt) in enumerate(infos):
        want = local_shape(glob, nd, pl.hierarchy, pl.coords(i))
        if tuple(shp) != want:
            _shard_mismatch(pl, i, shp, dt, infos, (glob, want), nd)
    return glob, np.dtype(dtype0) if dtype0 != "bfloat16" else np.dtype(_bf16())


def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def _shard_mismatch(pl, i, shp, dt, infos, expect, nd):
    who = "rank" if hasattr(runtime(), "world") else "device"
    j = next((j for j, info in enumerate(infos) if info != (tuple(shp), dt)), 0)
    msg = (
        f"make_global_array: {who} {pl.ranks[i]} passed a shard of shape {tuple(shp)} {dt}, "
        f"but {who} {pl.ranks[j]} passed {tuple(infos[j][0])} {infos[j][1]}"
    )
    if expect is not None:
        glob, want = expect
        msg += (
            f"; with sbp {nd} on {pl} that makes a global shape {glob}, whose shard on "
            f"{who} {pl.ranks[i]} is {want}"
        )
    raise user_error(
        ShapeError,
        msg + ". Fix: give every rank a shard of the same dtype and of its balanced size "
        "(split pieces differ by at most one, the larger ones first).",
    )


__all__ = [
    "placement",
    "sbp",
    "split",
    "S",
    "B",
    "P",
    "broadcast",
    "partial_sum",
    "partial_max",
    "partial_min",
    "to_global",
    "to_local",
    "DeviceProfile",
    "profile_devices",
]


# ----------------------------------------------------------------------------
# Measuring a device profile for the planner (fflow/device_profile.py)


def profile_devices(pl=None, small=256, large=4 << 20, path=None):
    """Measure a DeviceProfile on this machine, through the runtime that will run the
    plans: matmul FLOP/s, copy bandwidth, and the links of `pl`.

    On simulated devices (default `pl`: 2 of them) the links are an all-reduce through
    fflow's boxing (latency: a `small`-byte one; bandwidth: from the `large` one). Under
    `python -m fflow.launch` (default `pl`: every rank) they are the real transport:
    each collective runs right after a GEMM, as in a training step (best of 15):
    latency is a `small`-byte all-reduce through fflow's MPI collectives (the sync and
    call cost every collective pays), bandwidth an all-gather of `large` bytes along
    axis 0 (received in place, no host copy), `copy_bandwidth` a host copy of `large`
    bytes (what packing, joining and reducing cost, `shard_cost.host_copy_bytes`), and
    `overlap` the share of a 4 x `large`-byte all-reduce started before a GEMM that
    finished behind it. Every rank gets rank 0's numbers (the ranks must plan alike). On
    a loaded machine the numbers vary run to run (other processes' time slices), so
    measure on a quiet one. `path`:
    also write it as JSON; `FFLOW_DEVICE_PROFILE=path` makes it the planner's default.

    Example:
        >>> import fflow
        >>> p = fflow.sharding.profile_devices(fflow.placement("cpu", [0, 1]))
        >>> p.flops > 0 and p.latency_of(0) > 0
        True
    """
    n = 512
    a = np.ones((n, n), np.float32)
    flops = 2 * n**3 / best_time(lambda: a @ a)
    big = np.ones(large // 4, np.float32)
    out = np.empty_like(big)
    mem = 2 * big.nbytes / best_time(lambda: np.copyto(out, big))
    world = getattr(runtime(), "world", None)
    if world is None:
        prof = _profile_simulated(pl or placement("cpu", [0, 1]), small, large, flops, mem)
    else:
        pl = pl or placement("cpu", list(range(world.Get_size())))
        prof = _profile_mpi(world, pl, small, large, flops, mem, a)
    if path is not None and (world is None or world.Get_rank() == 0):
        prof.save(path)
    return prof


def _profile_simulated(pl, small, large, flops, mem):
    p = pl.size

    def allreduce(nbytes):
        x = to_global(np.ones(nbytes // 4, np.float32), pl, (P,) * pl.ndim)
        return best_time(lambda: to_global(x, sbp=(B,) * pl.ndim), 3)

    t_small, t_large = allreduce(small), allreduce(large)
    per_device = 2 * (p - 1) / p * large  # ring all-reduce bytes one device sends
    bw = per_device / max(t_large - t_small, 1e-9)
    return DeviceProfile(f"measured {pl}", flops, mem, latency=t_small, bandwidth=bw)


def _profile_mpi(world, pl, small, large, flops, mem, a, reps=15):
    """The links of MPI ranks, measured through fflow's MPI collectives as a training
    step meets them: each right after a GEMM (see `profile_devices`); rank 0's numbers
    go to every rank."""
    p = pl.size
    mine = world.Get_rank() in pl.ranks

    def after_gemm(fn):
        """Seconds of fn() run right after a GEMM (best of `reps`, so other processes'
        time slices drop out): what a collective costs in a step (the ranks arrive
        apart, its data is cold)."""
        fn()
        world.Barrier()
        best = float("inf")
        for _ in range(reps):
            a @ a
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    def boxing(value, src):
        x = to_global(value, pl, (src,) * pl.ndim)
        return lambda: to_global(x, sbp=(B,) * pl.ndim)

    tiny = np.ones(small // 4, np.float32)
    rows = np.ones((p * 1024, large // 4096 // p), np.float32)
    t_small, t_gather = after_gemm(boxing(tiny, P)), after_gemm(boxing(rows, S(0)))
    # never faster than the warm transport alone (ranks sharing cores can make the
    # difference of the two in-step times meaningless)
    gather = best_time(boxing(rows, S(0)), 7)
    warm = max(gather - best_time(boxing(tiny, P), 7), gather / 2)
    bw = (p - 1) / p * rows.nbytes / max(t_gather - t_small, warm, 1e-9)
    # overlap: an all-reduce of 4 x `large` bytes (long next to the GEMM's jitter)
    # started before a GEMM, waited after it
    buf, res = np.ones(large, np.float32), np.empty(large, np.float32)

    def seq():
        world.Allreduce(buf, res)
        a @ a

    def ovl():
        req = world.Iallreduce(buf, res)
        a @ a
        req.Wait()

    world.Barrier()
    t_ar = best_time(lambda: world.Allreduce(buf, res), reps)
    t_seq = t_ovl = float("inf")
    for _ in range(reps):  # interleaved, best of each: load drifts the same way for both
        t_seq, t_ovl = min(t_seq, best_time(seq, 1)), min(t_ovl, best_time(ovl, 1))
    overlap = min(1.0, max(0.0, (t_seq - t_ovl) / max(t_ar, 1e-9)))
    found = (flops, mem, t_small, bw, overlap) if mine else None
    flops, mem, t_small, bw, overlap = world.bcast(found, root=pl.ranks[0])
    return DeviceProfile(
        f"measured MPI {pl}", flops, mem, latency=t_small, bandwidth=bw,
        copy_bandwidth=mem, overlap=overlap,
    )  # fmt: skip


# -- the global-array methods of Array (OneFlow's tensor.to_global...) --------------
# fflow.array sits below this module, so the methods are added from here.


def _to_global_method(self, placement=None, sbp=None):
    """This array as a global array on `placement` with `sbp` (boxing if global)."""
    return to_global(self, placement, sbp)


def _to_local_method(self):
    """This process' shard of a global array (the array itself if local)."""
    return to_local(self)


def _to_local_shards_method(self):
    """Every simulated device's shard of a global array, in placement order."""
    return to_local_shards(self)


Array.to_global = _to_global_method
Array.to_local = _to_local_method
Array.to_local_shards = _to_local_shards_method


_JAX_NAMES = ("Mesh", "NamedSharding", "PartitionSpec", "SingleDeviceSharding", "Sharding")


def __getattr__(name):
    # JAX's jax.sharding names (`fflow.sharding.Mesh`...) live in fflow/jax_sharding.py,
    # loaded on first use like fflow's other lazy names
    if name in _JAX_NAMES:
        import importlib

        return getattr(importlib.import_module("fflow.jax_sharding"), name)
    raise AttributeError(f"module 'fflow.sharding' has no attribute {name!r}")
