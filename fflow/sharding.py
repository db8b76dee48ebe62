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

import functools
import os

import numpy as np

from fflow.device_profile import CPU, H200, DeviceProfile, best_time, default_profile  # noqa: F401
from fflow.errors import ShapeError, user_error

# ----------------------------------------------------------------------------
# SBP values


class SbpParallel:
    """One mesh axis' distribution of a logical array (base of Split/Broadcast/Partial)."""

    __slots__ = ()

    def is_split(self):
        return False

    def is_broadcast(self):
        return False

    def is_partial(self):
        return False


class Split(SbpParallel):
    __slots__ = ("axis", "_hash")

    def __init__(self, axis):
        if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
            raise user_error(TypeError, f"split needs an integer axis, got {axis!r}")
        self.axis = int(axis)
        self._hash = hash(("S", self.axis))

    def is_split(self):
        return True

    def __eq__(self, other):
        return type(other) is Split and other.axis == self.axis

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"S({self.axis})"

    def __reduce__(self):  # the hash is per process (string hashing): rebuild it
        return (Split, (self.axis,))


class Broadcast(SbpParallel):
    __slots__ = ()

    def is_broadcast(self):
        return True

    def __eq__(self, other):
        return type(other) is Broadcast

    def __hash__(self):
        return hash("B")

    def __repr__(self):
        return "B"


class Partial(SbpParallel):
    __slots__ = ("op", "_hash")

    def __init__(self, op="sum"):
        if op not in ("sum", "max", "min"):
            raise ValueError(f"partial op must be sum, max or min, not {op!r}")
        self.op = op
        self._hash = hash(("P", op))

    def is_partial(self):
        return True

    def __eq__(self, other):
        return type(other) is Partial and other.op == self.op

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return "P" if self.op == "sum" else f"P({self.op})"

    def __reduce__(self):
        return (Partial, (self.op,))


def split(axis=None, *, dim=None):
    """SBP: a balanced split of the logical array along `axis` (OneFlow's `dim`)."""
    if axis is None:
        axis = dim
    if axis is None:
        raise user_error(TypeError, "split needs an axis: fflow.sbp.split(0)")
    return Split(axis)


S = split
broadcast = B = Broadcast()
partial_sum = P = Partial("sum")
partial_max = Partial("max")
partial_min = Partial("min")


class _SbpNamespace:
    """`fflow.sbp`: the SBP constructors, named as in OneFlow (`flow.sbp.split(0)`)."""

    split = staticmethod(split)
    S = staticmethod(split)
    broadcast = B = broadcast
    partial_sum = P = partial_sum
    partial_max = partial_max
    partial_min = partial_min
    Split = Split
    Broadcast = Broadcast
    Partial = Partial

    def __repr__(self):
        return "fflow.sbp"


sbp = _SbpNamespace()


def reduce_fn(op):
    """The NumPy binary reduction of a partial op."""
    return {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]


def partial_identity(op, dtype):
    """The value a device holds for "no contribution" under P(op)."""
    dtype = np.dtype(dtype)
    if op == "sum":
        return dtype.type(0)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return dtype.type(-np.inf if op == "max" else np.inf)
    if dtype.kind == "b":
        return dtype.type(op == "min")
    info = np.iinfo(dtype)
    return dtype.type(info.min if op == "max" else info.max)


# ----------------------------------------------------------------------------
# Placement


def num_cpu_devices():
    """How many simulated CPU devices exist: FFLOW_NUM_CPU_DEVICES if set, else
    `fflow.config.cpu_devices` (FFLOW_CPU_DEVICES, default 8)."""
    env = os.environ.get("FFLOW_NUM_CPU_DEVICES")
    if env:
        return int(env)
    from fflow.config import config

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
# N-D SBP: normalisation, canonical form and the layout of shards


def as_nd_sbp(value, ndim, what="sbp"):
    """Normalise a user SBP (one SbpParallel or a tuple per mesh axis) to a tuple."""
    if isinstance(value, SbpParallel):
        if ndim != 1:
            raise user_error(
                ValueError,
                f"{what}: a placement with a {ndim}-D hierarchy needs one SBP per mesh axis, "
                f"e.g. (fflow.sbp.split(0), fflow.sbp.broadcast).",
            )
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(v, SbpParallel) for v in value):
        if len(value) != ndim:
            raise user_error(
                ValueError,
                f"{what}: got {len(value)} SBP entries {tuple(value)} for a placement with "
                f"{ndim} mesh axes; give one per mesh axis.",
            )
        return tuple(value)
    raise user_error(
        TypeError,
        f"{what}: expected fflow.sbp.split(k) / broadcast / partial_sum (or a tuple of "
        f"them per mesh axis), got {value!r}",
    )


def check_sbp_fits(shape, nd_sbp, hierarchy, what="sbp"):
    """Raise a user error if `nd_sbp` cannot describe an array of `shape`."""
    if _fits(tuple(shape), tuple(nd_sbp), tuple(hierarchy)):
        return
    _raise_unfit(shape, nd_sbp, hierarchy, what)


@functools.lru_cache(maxsize=65536)
def _fits(shape, nd_sbp, hierarchy):
    for s in nd_sbp:
        if s.is_split() and not 0 <= s.axis < len(shape):
            return False
    for axis in range(len(shape)):
        pieces = 1
        for h, s in zip(hierarchy, nd_sbp):
            if s.is_split() and s.axis == axis:
                pieces *= h
        if pieces > 1 and shape[axis] < pieces:
            return False
    return True


def _raise_unfit(shape, nd_sbp, hierarchy, what):
    for s in nd_sbp:
        if s.is_split() and not 0 <= s.axis < len(shape):
            raise user_error(
                ShapeError,
                f"{what}: split({s.axis}) is out of range for an array of shape "
                f"{tuple(shape)} (rank {len(shape)}). Fix: split an axis in "
                f"0..{len(shape) - 1}, or use broadcast.",
            )
    for axis in range(len(shape)):
        pieces = int(np.prod([h for h, s in zip(hierarchy, nd_sbp) if s == Split(axis)] or [1]))
        if pieces > 1 and shape[axis] < pieces:
            raise user_error(
                ShapeError,
                f"{what}: split({axis}) cuts dimension {axis} of shape {tuple(shape)} "
                f"(size {shape[axis]}) into {pieces} pieces, so some devices would get "
                f"nothing. Fix: use fewer devices on that axis, or broadcast.",
            )


@functools.lru_cache(maxsize=65536)
def canonical(hierarchy, nd_sbp):
    """Drop size-1 mesh axes and merge neighbouring axes with equal SBP.

    Returns (hierarchy, sbp, groups) where `groups[i]` lists the original mesh axes
    merged into canonical axis i. Lookups (signatures, boxing) use this form, and
    the layout of shards is defined on it.
    """
    hier, sbps, groups = [], [], []
    for axis, (h, s) in enumerate(zip(hierarchy, nd_sbp)):
        if h == 1:
            continue
        if sbps and sbps[-1] == s and groups[-1][-1] == _last_kept(hierarchy, axis):
            hier[-1] *= h
            groups[-1].append(axis)
        else:
            hier.append(h)
            sbps.append(s)
            groups.append([axis])
    return tuple(hier), tuple(sbps), tuple(tuple(g) for g in groups)


def _last_kept(hierarchy, axis):
    for a in range(axis - 1, -1, -1):
        if hierarchy[a] != 1:
            return a
    return -1


def balanced(n, p):
    """Sizes of `n` split into `p` balanced pieces (the first n mod p get one more)."""
    q, r = divmod(int(n), int(p))
    return [q + (1 if i < r else 0) for i in range(p)]


def piece_bounds(n, p, i):
    q, r = divmod(int(n), int(p))
    start = i * q + min(i, r)
    return start, start + q + (1 if i < r else 0)


def group_coord(coords, groups, hierarchy):
    """The coordinate of a device along each canonical axis (row-major within a group)."""
    out = []
    for g in groups:
        c = 0
        for a in g:
            c = c * hierarchy[a] + coords[a]
        out.append(c)
    return out


def local_box(shape, nd_sbp, hierarchy, coords):
    """The (start, stop) per dim of the logical array held by the device at `coords`."""
    return _local_box(tuple(shape), tuple(nd_sbp), tuple(hierarchy), tuple(coords))


@functools.lru_cache(maxsize=262144)
def _local_box(shape, nd_sbp, hierarchy, coords):
    hier, sbps, groups = canonical(hierarchy, nd_sbp)
    gc = group_coord(coords, groups, hierarchy)
    box = [[0, d] for d in shape]
    for h, s, c in zip(hier, sbps, gc):
        if s.is_split():
            lo, hi = box[s.axis]
            a, b = piece_bounds(hi - lo, h, c)
            box[s.axis] = [lo + a, lo + b]
    return tuple((a, b) for a, b in box)


def local_shape(shape, nd_sbp, hierarchy, coords):
    return tuple(b - a for a, b in local_box(shape, nd_sbp, hierarchy, coords))


def partial_keeper(nd_sbp, hierarchy, coords):
    """True if this device holds the data (not the identity) when scattering onto P axes."""
    for s, c in zip(nd_sbp, coords):
        if s.is_partial() and s.op == "sum" and c != 0:
            return False
    return True


def scatter_global(value, nd_sbp, pl):
    """Per-device local arrays of a logical NumPy `value` (P: the data on coordinate 0)."""
    out = []
    for i in range(pl.size):
        coords = pl.coords(i)
        box = local_box(value.shape, nd_sbp, pl.hierarchy, coords)
        piece = value[tuple(slice(a, b) for a, b in box)]
        if partial_keeper(nd_sbp, pl.hierarchy, coords):
            out.append(np.array(piece))
        else:
            out.append(np.zeros_like(piece))
    return out


def assemble(shards, shape, nd_sbp, pl):
    """The logical array from per-device shards (dict or list by flat index)."""
    dtype = shards[0].dtype
    result = np.zeros(shape, dtype)
    groups = {}
    for i in range(pl.size):
        coords = pl.coords(i)
        key = tuple(0 if s.is_partial() else c for s, c in zip(nd_sbp, coords))
        groups.setdefault(key, []).append((coords, shards[i]))
    for key, members in groups.items():
        box = local_box(shape, nd_sbp, pl.hierarchy, key)
        result[tuple(slice(a, b) for a, b in box)] = _reduce_partials(members, nd_sbp)
    return result


def _reduce_partials(members, nd_sbp):
    """Reduce device values over the P mesh axes, innermost axis first."""
    values = {tuple(c): v for c, v in members}
    for m in reversed(range(len(nd_sbp))):
        s = nd_sbp[m]
        if not s.is_partial():
            continue
        fn = reduce_fn(s.op)
        merged = {}
        for c in sorted(values):
            key = c[:m] + (0,) + c[m + 1 :]
            merged[key] = values[c] if key not in merged else fn(merged[key], values[c])
        values = merged
    (value,) = values.values()
    return value


# ----------------------------------------------------------------------------
# Runtimes

_runtime = None


def runtime():
    """The runtime executing global arrays: MPI under `fflow.launch`, else simulated."""
    global _runtime
    if _runtime is None:
        if os.environ.get("FFLOW_RUNTIME", "").lower() == "mpi":
            from fflow.runtime_mpi import MPIRuntime  # loads mpi4py

            _runtime = MPIRuntime()
        else:
            from fflow.runtime_sim import SimRuntime

            _runtime = SimRuntime()
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
    from fflow.array import Array

    sharding = Sharding(pl, nd_sbp)
    out = Array(GlobalValue(shape, dtype, sharding, shards), weak_type)
    out._sharding = sharding
    return out


def is_global(x):
    from fflow.array import Array

    return type(x) is Array and x._sharding is not None


# Moving a global array to other devices: transforms/shard_transfer.py installs its
# point-to-point boxing here when fflow is imported (a hook, so this module does not
# import it back).
placement_movers = []


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
    from fflow import core
    from fflow.api_util import as_value
    from fflow.transforms import shard as _shard  # noqa: F401  (eager global dispatch)

    if isinstance(x, core.Tracer):
        if sbp is None:
            raise user_error(ValueError, "to_global of a traced value needs an sbp")
        from fflow.transforms.shard import with_sbp

        return with_sbp(x, sbp)
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
        from fflow.transforms.shard_boxing import box_global

        return box_global(x, pl, target)
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
    from fflow.array import Array

    return Array(runtime().local_of(x._value))


def to_local_shards(x):
    from fflow.array import Array

    return [Array(v) for _, v in sorted(x._value.shards.items())]


def global_from_shards(shards, shape, pl, sbp, dtype=None):
    """A global array from explicit per-device local arrays (indexed by flat position)."""
    shards = {i: np.asarray(s) for i, s in enumerate(shards)}
    dtype = dtype or next(iter(shards.values())).dtype
    return make_global(shape, dtype, pl, as_nd_sbp(sbp, pl.ndim), shards)


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


def profile_devices(pl=None, small=256, large=1 << 20):
    """Measure a DeviceProfile on this machine: matmul FLOP/s, copy bandwidth, and the
    latency and bandwidth of an all-reduce over `pl` (default: 2 simulated devices).

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
    pl = pl or placement("cpu", [0, 1])
    p = pl.size

    def allreduce(nbytes):
        x = to_global(np.ones(nbytes // 4, np.float32), pl, (P,) * pl.ndim)
        return best_time(lambda: to_global(x, sbp=(B,) * pl.ndim), 3)

    t_small, t_large = allreduce(small), allreduce(large)
    per_device = 2 * (p - 1) / p * large  # ring all-reduce bytes one device sends
    bw = per_device / max(t_large - t_small, 1e-9)
    return DeviceProfile(f"measured {pl}", flops, mem, latency=t_small, bandwidth=bw)
