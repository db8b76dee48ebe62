"""The planner's cost model: seconds per device for computing and for boxing.

Compute: an equation's FLOPs (a matmul 2*M*N*K, an elementwise op one per element,
data movement counted as bytes) times the share of the work one device does under
a signature (a split matmul 1/p of the replicated one; a partial-sum output is full
size but each device reduced 1/p of the contraction), over the profile's
throughput. Communication: per collective step, the profile's latency plus the
bytes one device moves over the link bandwidth of that mesh axis. The constants
live in a `DeviceProfile` (fflow/device_profile.py), so plans for an H200 node and for
simulated CPU devices differ where the hardware says they should.
"""

import math

from fflow.primitives.dot import dot_general_p
from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.primitives.scan import scan_p
from fflow.transforms import shard_buckets  # noqa: F401  (defines config.grad_bucket_mb)

from fflow.config import config

__all__ = [
    "eqn_flops",
    "work_share",
    "compute_time",
    "boxing_time",
    "hidden_time",
    "is_bucketed_reduce",
    "host_copy_bytes",
]

# primitives whose cost is moving bytes, not arithmetic
MOVE_TRAITS = ("shape", "indexing")


def _size(aval):
    return math.prod(aval.shape) if aval.shape else 1


def eqn_flops(eqn):
    """(flops, bytes touched) of one equation on the whole (global) value."""
    prim = eqn.primitive
    outs = [_size(v.aval) for v in eqn.outputs]
    ins = [_size(v.aval) for v in eqn.inputs]
    nbytes = sum(s * v.aval.dtype.itemsize for s, v in zip(ins, eqn.inputs))
    nbytes += sum(s * v.aval.dtype.itemsize for s, v in zip(outs, eqn.outputs))
    if prim is dot_general_p:
        (lc, _), _ = eqn.params["dimension_numbers"]
        k = math.prod(eqn.inputs[0].aval.shape[d] for d in lc) if lc else 1
        return 2.0 * outs[0] * k, nbytes
    if prim is scan_p:  # its body's work, every step
        body = [eqn_flops(e) for e in eqn.params["jaxpr"].eqns]
        n = eqn.params["length"]
        return n * sum(f for f, _ in body), n * sum(b for _, b in body)
    if prim is sbp_constraint_p:
        return 0.0, 0
    if any(t in prim.traits for t in MOVE_TRAITS):
        return 0.0, nbytes
    if "reduction" in prim.traits or "cumulative" in prim.traits:
        return float(max(ins or [0])), nbytes
    weight = 8.0 if "transcendental" in prim.traits else 1.0  # a libm call costs more
    return weight * float(max(outs or [0])), nbytes


def _fraction(aval, nd, hierarchy):
    """The share of `aval` one device holds under `nd` (partial and broadcast hold it all)."""
    pieces = 1
    for h, s in zip(hierarchy, nd):
        if s.is_split():
            pieces *= min(h, aval.shape[s.axis]) if aval.shape else 1
    return 1.0 / pieces


def work_share(eqn, sig, hierarchy):
    """The share of an equation's work one device does under `sig`: the smallest local
    share of any operand (a device never does more than its smallest piece allows)."""
    share = 1.0
    for v, nd in zip(eqn.inputs, sig.ins):
        share = min(share, _fraction(v.aval, nd, hierarchy))
    for v, nd in zip(eqn.outputs, sig.outs):
        share = min(share, _fraction(v.aval, nd, hierarchy))
    return share


def compute_time(eqn, sig, hierarchy, profile, flops=None):
    """Seconds one device spends on `eqn` under `sig` (roofline: max of math and memory)."""
    f, b = eqn_flops(eqn) if flops is None else flops
    t = max(f / profile.flops, b / profile.mem_bandwidth)
    return t * work_share(eqn, sig, hierarchy)


def boxing_time(bp, hierarchy, profile, bucketed=0):
    """Seconds of one BoxingPlan: each communicating step costs latency + bytes/bandwidth.

    `bucketed` (n > 0): the value is read only late (a gradient in the optimizer tail),
    so its all-reduce (sum) is fused with others into a bucket of `grad_bucket_mb`
    (transforms/shard_buckets.py) and pays its share of that bucket's latency: its
    share of the bucket's bytes, but at least 1/n (a bucket has at most n members)."""
    n = math.prod(hierarchy) if hierarchy else 1
    bucket = float(config.grad_bucket_mb) * (1 << 20) if bucketed else 0.0
    t = 0.0
    for st in bp.steps:
        if not st.bytes:
            continue
        axes = st.axes if st.axes is not None else tuple(range(len(hierarchy)))
        lat = max(profile.latency_of(m) for m in axes)
        bw = min(profile.bandwidth_of(m) for m in axes)
        per_device = st.bytes / n
        if bucket > 0 and st.kind == "axis" and st.src.is_partial() and st.dst.is_broadcast():
            lat *= min(1.0, max(per_device / bucket, 1.0 / bucketed))
        t += lat + per_device / bw
        if profile.copy_bandwidth:
            t += host_copy_bytes(st, per_device, hierarchy) / profile.copy_bandwidth
    return t


def host_copy_bytes(st, per_device, hierarchy):
    """Memory traffic (bytes read + written) one device spends on host copies around one
    collective step of fflow's MPI runtime (fflow/mpi_ops.py): packing the pieces of a
    split along a non-leading axis into one send buffer, joining received blocks along a
    non-leading axis, and reducing received partial sums (each member reduces 1/p of
    the value: reads p pieces, writes one). `per_device`: the bytes this device sends.

    Example (2 devices, a 1 MB value: gathered along axis 1 it is joined once, 2 MB of
    traffic; along axis 0 it lands in place):
        >>> from fflow.sbp import B, S
        >>> from fflow.transforms.shard_boxing import Step
        >>> host_copy_bytes(Step("axis", (0,), S(1), B, None, 1 << 20), 1 << 19, (2,))
        2097152.0
        >>> host_copy_bytes(Step("axis", (0,), S(0), B, None, 1 << 20), 1 << 19, (2,))
        0.0
    """
    x, y = st.src, st.dst
    if st.kind != "axis":  # the exchange: every piece sent is packed once, received once
        return 4.0 * per_device
    axes = st.axes if st.axes is not None else tuple(range(len(hierarchy)))
    p = math.prod(hierarchy[a] for a in axes)
    if p <= 1:
        return 0.0
    if x.is_split() and y.is_broadcast():  # all_gather: per device (p-1)/p of the value
        t = per_device * p / (p - 1)
        return 2.0 * t if x.axis else 0.0
    if x.is_split() and y.is_split():  # all_to_all: per device (p-1)/p of its 1/p piece
        piece = per_device * p / (p - 1)
        return 2.0 * piece * ((y.axis != 0) + (x.axis != 0))
    if x.is_partial():
        if y.is_split():  # reduce_scatter: pack (non-leading axis), reduce 1/p
            t = per_device * p / (p - 1)
            return (2.0 * t if y.axis else 0.0) + t * (p + 1) / p
        t = per_device * p / (2 * (p - 1))  # all_reduce: reduce 1/p (in place)
        return t * (p + 1) / p
    return 0.0


def is_bucketed_reduce(bp):
    """Whether a BoxingPlan is only all-reduces of partial sums to broadcast: what the
    runtimes put into gradient buckets (transforms/shard_buckets.py), started when the
    value is ready and waited for where it is read."""
    return bool(bp.steps) and all(
        st.kind == "axis"
        and st.src.is_partial()
        and st.src.op == "sum"
        and st.dst.is_broadcast()
        or not st.bytes
        for st in bp.steps
    )


def hidden_time(items, overlap=1.0):
    """Seconds of each bucketed all-reduce that overlap compute (DDP's overlap of the
    gradient all-reduces with the rest of the backward pass).

    `items`: (key, ready, needed, seconds): the time its value is computed and the time
    the first reader starts, on the program's compute timeline, and what the
    all-reduce takes. The link runs one all-reduce at a time, in the order the values
    become ready; each hides the part of it that ends before its reader starts (the
    last gradient of a backward pass, read right away by the optimizer, hides
    nothing). `overlap` (the profile's): the share of an all-reduce that can run while
    the device computes; 0 (MPI ranks on host cores: their shared-memory transport
    moves data only inside MPI calls, on the ranks' own CPUs) hides nothing. Returns
    {key: hidden seconds}, each at most `overlap` times its `seconds`.

    Example:
        >>> hidden_time([("a", 0.0, 10.0, 4.0), ("b", 1.0, 6.0, 4.0), ("c", 9.0, 9.0, 1.0)])
        {'a': 4.0, 'b': 2.0, 'c': 0.0}
        >>> hidden_time([("a", 0.0, 10.0, 4.0)], overlap=0.0)
        {'a': 0.0}
    """
    link = 0.0  # when the link is free
    out = {}
    for key, ready, needed, t in sorted(items, key=lambda it: it[1]):
        start = max(ready, link)
        out[key] = max(0.0, min(t, needed - start)) * overlap
        link = start + t
    return out
