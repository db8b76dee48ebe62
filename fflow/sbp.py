"""SBP values, OneFlow's distribution of a logical array over one mesh axis, and the
layout of shards (`fflow.sbp`, the constructors named as in OneFlow: `fflow.sbp.split(0)`).

* `split(k)` (short `S(k)`): each device holds a balanced slice along dim `k`
  (the first `n mod p` slices are one element longer);
* `broadcast` (`B`): each device holds the whole array;
* `partial_sum` (`P`), `partial_max`, `partial_min`: each device holds an array of
  the full shape and the logical value is their sum / max / min.

Pure values and functions on NumPy data: primitives' SBP rules and the shard transform
use them; placements, runtimes and global arrays live in fflow/sharding.py.

Example:
    >>> import fflow
    >>> fflow.sbp.split(0), fflow.sbp.broadcast, fflow.sbp.partial_sum
    (S(0), B, P)
"""

import functools

import numpy as np

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


@functools.lru_cache(maxsize=4096)
def _scatter_plan(shape, nd_sbp, pl):
    out = []
    for i in range(pl.size):
        coords = pl.coords(i)
        box = local_box(shape, nd_sbp, pl.hierarchy, coords)
        keep = partial_keeper(nd_sbp, pl.hierarchy, coords)
        out.append((tuple(slice(a, b) for a, b in box), keep))
    return out


def scatter_global(value, nd_sbp, pl):
    """Per-device local arrays of a logical NumPy `value` (P: the data on coordinate 0).

    Shards are views of `value` (device programs never write into their inputs)."""
    out = []
    for idx, keep in _scatter_plan(value.shape, tuple(nd_sbp), pl):
        piece = value[idx]
        out.append(piece if keep else np.zeros_like(piece))
    return out


def local_piece(value, nd_sbp, pl, i):
    """Device i's shard of a logical NumPy `value` (a view; zeros off the P keeper)."""
    idx, keep = _scatter_plan(value.shape, tuple(nd_sbp), pl)[i]
    piece = value[idx]
    return piece if keep else np.zeros_like(piece)


def assemble(shards, shape, nd_sbp, pl):
    """The logical array from per-device shards (dict or list by flat index)."""
    if all(s.is_broadcast() for s in nd_sbp):
        return shards[0]
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
