"""Boxing: converting a value from one N-D SBP to another with the cheapest collectives.

1-D conversions over a group of p devices holding a logical T-byte value (the
cost function of OneFlow's sbp_infer_util.cpp, plus partial max/min):

    P -> B   all_reduce      2(p-1)T        S(i) -> S(j)  all_to_all   (p-1)/p T
    P -> S   reduce_scatter  (p-1)T         B -> S        shard_slice  0
    S -> B   all_gather      (p-1)T         S -> P, B -> P  (local)    0

N-D conversions run per mesh axis (merged mesh axes when both SBPs merge them the
same way, see `sharding.canonical`): a shortest-path search over per-axis steps,
each valid when no other axis splits the tensor dimension the step touches, or
when every axis that does precedes the step's axes and the dim divides evenly by all
of them (a nested split: device (a0, a1) holds chunk a0*n1 + a1, the layout of
(S(0), S(0)); so (S(0), P) -> (S(0), S(0)) is one reduce-scatter, not an all-reduce
and a slice). When
no such path exists, the general slice-intersection `exchange` moves exactly the
pieces each device lacks. Costs are exact byte counts (uneven splits included);
the runtimes measure the bytes their messages carry, and both agree. A dim that
every split divides evenly counts linearly, so plans are made once on that dim
shrunk to the mesh size and scaled (a model's many shapes share a few plans).
"""

import functools
import heapq
import itertools
import math

import numpy as np
from fflow.primitives import collectives as coll

from fflow.sbp import B, Broadcast, Partial, Split, balanced, canonical, local_box


class Step:
    """One conversion: per work axis (`axes` = merged mesh axes) or the general exchange."""

    __slots__ = ("kind", "axes", "src", "dst", "before", "bytes")

    def __init__(self, kind, axes, src, dst, before, nbytes):
        self.kind = kind  # "axis" or "exchange"
        self.axes = axes
        self.src = src
        self.dst = dst
        self.before = before  # full N-D sbp before the step
        self.bytes = nbytes

    def describe(self):
        if self.kind == "exchange":
            return f"exchange {self.src}->{self.dst}"
        return f"{_op_name(self.src, self.dst)}[mesh_axes={self.axes} {self.src}->{self.dst}]"


class BoxingPlan:
    __slots__ = ("steps", "bytes", "src", "dst")

    def __init__(self, steps, src, dst):
        self.steps = steps
        self.src = src
        self.dst = dst
        self.bytes = int(sum(s.bytes for s in steps))

    def collectives(self):
        """Names of the primitives this plan binds (what the printed program shows)."""
        names = []
        for s in self.steps:
            names.extend(_op_names(s))
        return names


def _op_name(x, y):
    return "+".join(_ops_1d_names(x, y)) or "nothing"


def _ops_1d_names(x, y):
    if x == y:
        return []
    if x.is_split():
        if y.is_broadcast():
            return ["all_gather"]
        if y.is_split():
            return ["all_to_all"]
        return ["shard_pad"]
    if x.is_broadcast():
        if y.is_split():
            return ["shard_slice"]
        return ["keep_one"] if y.op == "sum" else []
    if y.is_broadcast():
        return ["all_reduce"]
    if y.is_split():
        return ["reduce_scatter"]
    return ["all_reduce"] + _ops_1d_names(B, y)


def _op_names(step):
    if step.kind == "exchange":
        return ["exchange"]
    return _ops_1d_names(step.src, step.dst)


# ----------------------------------------------------------------------------
# Cost of one 1-D conversion on a group piece of shape G


def bytes_1d(x, y, g_shape, p, itemsize):
    t = math.prod(g_shape) * itemsize
    if x == y or p == 1:
        return 0
    if x.is_split() and y.is_broadcast():
        return (p - 1) * t
    if x.is_split() and y.is_split():
        i, j = x.axis, y.axis
        rest = t // max(g_shape[i] * g_shape[j], 1) if g_shape[i] * g_shape[j] else 0
        ins, outs = balanced(g_shape[i], p), balanced(g_shape[j], p)
        return t - sum(a * b for a, b in zip(ins, outs)) * rest
    if x.is_partial():
        if y.is_broadcast():
            return 2 * (p - 1) * t
        if y.is_split():
            return (p - 1) * t
        return 2 * (p - 1) * t  # P(a) -> P(b): all-reduce, then keep
    return 0  # S -> P, B -> S, B -> P are local


# ----------------------------------------------------------------------------
# Work axes and groups


def _work_axes(hierarchy, src, dst):
    _, _, gs = canonical(hierarchy, src)
    _, _, gd = canonical(hierarchy, dst)
    if gs == gd:
        return tuple(tuple(g) for g in gs)
    return tuple((m,) for m, h in enumerate(hierarchy) if h > 1)


def _expand(hierarchy, work, cur):
    full = [B] * len(hierarchy)
    for axes, s in zip(work, cur):
        for m in axes:
            full[m] = s
    return tuple(full)


@functools.lru_cache(maxsize=4096)
def _coords(hierarchy):
    return list(itertools.product(*[range(h) for h in hierarchy]))


@functools.lru_cache(maxsize=4096)
def groups_of(hierarchy, axes):
    """Flat device indices grouped by the mesh axes `axes` (members in row-major order)."""
    groups = {}
    for flat, c in enumerate(_coords(hierarchy)):
        key = tuple(v for m, v in enumerate(c) if m not in axes)
        groups.setdefault(key, []).append(flat)
    return list(groups.values())


_step_cache = {}


def _step_bytes(shape, itemsize, hierarchy, work, cur, w, x, y):
    # the same step recurs in many conversions' searches (and in every layer)
    key = (shape, itemsize, hierarchy, work, cur, w, x, y)
    nb = _step_cache.get(key)
    if nb is None:
        nb = _step_cache[key] = _step_bytes_of(shape, itemsize, hierarchy, work, cur, w, x, y)
    return nb


def _step_bytes_of(shape, itemsize, hierarchy, work, cur, w, x, y):
    p = math.prod(hierarchy[m] for m in work[w])
    piece_sbp = _expand(hierarchy, work, cur[:w] + (B,) + cur[w + 1 :])
    coords = _coords(hierarchy)
    total = 0
    for members in groups_of(hierarchy, work[w]):
        box = local_box(shape, piece_sbp, hierarchy, coords[members[0]])
        total += bytes_1d(x, y, tuple(b - a for a, b in box), p, itemsize)
    return total


def _valid_step(shape, hierarchy, work, cur, w, x, y):
    # a step may touch a tensor dim other axes split only as the innermost split: every
    # such axis precedes the step's mesh axes (device (a0, a1) then holds chunk
    # a0*n1 + a1, the layout `local_box` gives), and the dim divides evenly by all
    # of them (uneven nested pieces differ from the merged layout's balanced pieces)
    for s in (x, y):
        if not s.is_split():
            continue
        count = math.prod(hierarchy[m] for m in work[w])
        for v, t in enumerate(cur):
            if v != w and t == s:
                if max(work[v]) > min(work[w]):
                    return False
                count *= math.prod(hierarchy[m] for m in work[v])
        if count != math.prod(hierarchy[m] for m in work[w]) and shape[s.axis] % count:
            return False
    return True


# ----------------------------------------------------------------------------
# Planning

_plan_cache = {}


def plan_boxing(shape, dtype, hierarchy, src, dst):
    """The cheapest BoxingPlan from N-D sbp `src` to `dst` for a logical `shape`."""
    key = (shape, dtype, hierarchy, src, dst)
    plan = _plan_cache.get(key)
    if plan is None:
        shape, hierarchy, src, dst = tuple(shape), tuple(hierarchy), tuple(src), tuple(dst)
        itemsize = np.dtype(dtype).itemsize
        n = math.prod(hierarchy)
        # a dim that every split divides evenly enters every byte count linearly: plan
        # on that dim of size n (one byte per item) and scale, so the many shapes of
        # a model share a few plans (the path is the same: every step scales alike)
        small = tuple(n if d % n == 0 and d > n else d for d in shape)
        scale = itemsize * math.prod(d // n for d, c in zip(shape, small) if c != d)
        if scale != 1:
            base = plan_boxing(small, np.uint8, hierarchy, src, dst)
            plan = _scaled(base, scale)
        else:
            plan = _plan(shape, itemsize, hierarchy, src, dst)
        _plan_cache[key] = plan
    return plan


def _scaled(bp, scale):
    steps = [Step(s.kind, s.axes, s.src, s.dst, s.before, s.bytes * scale) for s in bp.steps]
    return BoxingPlan(steps, bp.src, bp.dst)


def boxing_bytes(shape, dtype, hierarchy, src, dst):
    return plan_boxing(shape, dtype, hierarchy, src, dst).bytes


def _plan(shape, itemsize, hierarchy, src, dst):
    if canonical(hierarchy, src)[:2] == canonical(hierarchy, dst)[:2]:
        return BoxingPlan([], src, dst)
    work = _work_axes(hierarchy, src, dst)
    start = tuple(_expand_back(hierarchy, work, src))
    goal = tuple(_expand_back(hierarchy, work, dst))
    best = _search(shape, itemsize, hierarchy, work, start, goal)
    fallback = _fallback(shape, itemsize, hierarchy, work, start, goal)
    if best is None or fallback.bytes < best.bytes:
        best = fallback
    best.src, best.dst = src, dst
    return best


def _expand_back(hierarchy, work, nd):
    return [nd[axes[0]] for axes in work]


def _search(shape, itemsize, hierarchy, work, start, goal):
    # Dijkstra over per-axis states; a step moves one axis to its goal or to B.
    counter = itertools.count()
    heap = [(0, 0, next(counter), start, [])]
    seen = {}
    while heap:
        cost, nsteps, _, cur, steps = heapq.heappop(heap)
        if cur == goal:
            return BoxingPlan(steps, None, None)
        if seen.get(cur, (1 << 62, 0)) <= (cost, nsteps):
            continue
        seen[cur] = (cost, nsteps)
        for w, (x, g) in enumerate(zip(cur, goal)):
            if x == g:
                continue
            for y in [g] if g == B else [g, B]:
                if y == x or not _valid_step(shape, hierarchy, work, cur, w, x, y):
                    continue
                nb = _step_bytes(shape, itemsize, hierarchy, work, cur, w, x, y)
                before = _expand(hierarchy, work, cur)
                nxt = cur[:w] + (y,) + cur[w + 1 :]
                step = Step("axis", work[w], x, y, before, nb)
                heapq.heappush(heap, (cost + nb, nsteps + 1, next(counter), nxt, steps + [step]))
    return None


def _fallback(shape, itemsize, hierarchy, work, start, goal):
    steps = []
    cur = start
    for w, x in enumerate(cur):
        if x.is_partial():
            nb = _step_bytes(shape, itemsize, hierarchy, work, cur, w, x, B)
            steps.append(Step("axis", work[w], x, B, _expand(hierarchy, work, cur), nb))
            cur = cur[:w] + (B,) + cur[w + 1 :]
    target = tuple(B if s.is_partial() else s for s in goal)
    if cur != target:
        src_nd = _expand(hierarchy, work, cur)
        dst_nd = _expand(hierarchy, work, target)
        nb = exchange_bytes(shape, itemsize, hierarchy, src_nd, dst_nd)
        steps.append(Step("exchange", None, src_nd, dst_nd, src_nd, nb))
        cur = target
    for w, y in enumerate(goal):
        if y.is_partial():
            steps.append(Step("axis", work[w], B, y, _expand(hierarchy, work, cur), 0))
            cur = cur[:w] + (y,) + cur[w + 1 :]
    return BoxingPlan(steps, None, None)


def exchange_bytes(shape, itemsize, hierarchy, src, dst):
    """The bytes `exchange_plan` moves, without its message lists: the distinct source
    boxes (no partial axes) tile the array and each device holds one, so a device
    receives all of its destination box except what its own source box covers."""
    total = 0
    for c in _coords(hierarchy):
        a, b = local_box(shape, src, hierarchy, c), local_box(shape, dst, hierarchy, c)
        total += math.prod(hi - lo for lo, hi in b)
        total -= math.prod(max(0, min(a1, b1) - max(a0, b0)) for (a0, a1), (b0, b1) in zip(a, b))
    return total * itemsize


_exchange_cache = {}


def exchange_plan(shape, itemsize, hierarchy, src, dst):
    """Per-device (sends, recvs, local) for the slice-intersection exchange, and its bytes."""
    key = (shape, itemsize, hierarchy, src, dst)
    hit = _exchange_cache.get(key)
    if hit is not None:
        return hit
    coords = _coords(hierarchy)
    n = len(coords)
    src_boxes = [local_box(shape, src, hierarchy, c) for c in coords]
    holders = {}
    for i, b in enumerate(src_boxes):
        holders.setdefault(b, []).append(i)
    per_dev = [{"sends": [], "recvs": [], "local": []} for _ in range(n)]
    total = 0
    for i, c in enumerate(coords):
        out_box = local_box(shape, dst, hierarchy, c)
        for b, hs in holders.items():
            inter = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(b, out_box))
            if any(hi <= lo for lo, hi in inter):
                continue
            provider = i if i in hs else hs[0]
            in_rel = tuple((lo - s0, hi - s0) for (lo, hi), (s0, _) in zip(inter, b))
            out_rel = tuple((lo - o0, hi - o0) for (lo, hi), (o0, _) in zip(inter, out_box))
            if provider == i:
                per_dev[i]["local"].append((in_rel, out_rel))
            else:
                per_dev[provider]["sends"].append((i, in_rel))
                per_dev[i]["recvs"].append((provider, out_rel))
                total += int(np.prod([hi - lo for lo, hi in inter], dtype=np.int64)) * itemsize
    result = (per_dev, total)
    _exchange_cache[key] = result
    return result


# ----------------------------------------------------------------------------
# Applying a plan on one device (binds collectives on the current trace)


def apply_boxing(x, plan, shape, dtype, pl, flat):
    """Convert device `flat`'s local `x` along `plan`; returns the new local value."""
    hierarchy = pl.hierarchy
    coords = _coords(hierarchy)
    for step in plan.steps:
        if step.kind == "exchange":
            per_dev, _ = exchange_plan(
                tuple(shape), np.dtype(dtype).itemsize, hierarchy, step.src, step.dst
            )
            mine = per_dev[flat]
            out_box = local_box(shape, step.dst, hierarchy, coords[flat])
            x = coll.exchange_p.bind(
                x,
                sends=tuple(mine["sends"]),
                recvs=tuple(mine["recvs"]),
                local=tuple(mine["local"]),
                out_shape=tuple(b - a for a, b in out_box),
                accumulate=False,
                group=tuple(range(pl.size)),
                index=flat,
                placement=pl,
            )
            continue
        members = next(g for g in groups_of(hierarchy, step.axes) if flat in g)
        index = members.index(flat)
        p = len(members)
        piece_sbp = tuple(B if m in step.axes else s for m, s in enumerate(step.before))
        box = local_box(shape, piece_sbp, hierarchy, coords[flat])
        g_shape = tuple(b - a for a, b in box)
        common = dict(group=tuple(members), index=index, placement=pl)
        x = _apply_1d(x, step.src, step.dst, g_shape, p, common)
    return x


def _apply_1d(x, src, dst, g, p, common):
    if src == dst:
        return x
    if isinstance(src, Split):
        sizes = tuple(balanced(g[src.axis], p))
        if isinstance(dst, Broadcast):
            return coll.all_gather_p.bind(x, axis=src.axis, sizes=sizes, **common)
        if isinstance(dst, Split):
            return coll.all_to_all_p.bind(
                x,
                in_axis=src.axis,
                out_axis=dst.axis,
                in_sizes=sizes,
                out_sizes=tuple(balanced(g[dst.axis], p)),
                **common,
            )
        fill = 0 if dst.op == "sum" else dst.op
        return coll.shard_pad_p.bind(x, axis=src.axis, sizes=sizes, fill=fill, **common)
    if isinstance(src, Broadcast):
        if isinstance(dst, Split):
            sizes = tuple(balanced(g[dst.axis], p))
            return coll.shard_slice_p.bind(x, axis=dst.axis, sizes=sizes, **common)
        return coll.keep_one_p.bind(x, **common) if dst.op == "sum" else x
    assert isinstance(src, Partial)
    if isinstance(dst, Split):
        sizes = tuple(balanced(g[dst.axis], p))
        return coll.reduce_scatter_p.bind(x, op=src.op, axis=dst.axis, sizes=sizes, **common)
    x = coll.all_reduce_p.bind(x, op=src.op, **common)
    return _apply_1d(x, B, dst, g, p, common)
