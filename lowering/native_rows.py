"""Row-fused native kernels of the NumPy backend: softmax over the last axis.

`softmax(x) = e / sum(e)` with `e = exp(x - max(x))` is six NumPy passes over the
tensor (max, subtract, exp, sum, divide and the broadcasts between them); in C it is
one loop nest per row that reads x twice and writes e and y once, the row max and
sum staying in registers (when the divide is fused into its consumers' group, the
kernel stops at e and the sum). The pattern is matched on the schedule (reduce_max ->
reshape -> [stop_gradient] -> broadcast -> {sub, exp} -> reduce_sum -> reshape ->
broadcast -> div), the form `fflow.nn.softmax` and hand-written softmaxes take; the
row max `m`, `e`, the row sum `s` and `y` are all materialised (the backward pass
reads `e`, `s` and `y`), the reshapes and broadcasts of `m` and `s` stay NumPy views.

Only for tensors of at least `native.NATIVE_MIN_SIZE` elements, as for other
transcendental groups (exp may differ from NumPy's by an ulp, and the row sum is
accumulated in a different order; NaN and infinities behave as in NumPy).
"""

import ctypes

import numpy as np
from fflow.lowering import native
from fflow.lowering.schedule import FusionGroup
from fflow.primitives.binary import div_p, sub_p
from fflow.primitives.reduction import reduce_sum_p
from fflow.primitives.shape import broadcast_in_dim_p, reshape_p
from fflow.primitives.unary import exp_p, stop_gradient_p

_SOURCE = """#include <math.h>
#pragma omp declare simd notinbranch
{t} {exp}({t});
void {fname}(const {t}* x, {t}* m, {t}* e, {t}* s, {t}* y, long rows, long n) {{
  for (long r = 0; r < rows; r++) {{
    const {t}* xr = x + r * n;
    {t}* er = e + r * n;
    {t}* yr = y ? y + r * n : 0;
    {t} mx = -INFINITY;
    int nan = 0;
    #pragma omp simd reduction(max:mx) reduction(|:nan)
    for (long j = 0; j < n; j++) {{
      mx = xr[j] > mx ? xr[j] : mx;
      nan |= xr[j] != xr[j];
    }}
    if (nan) mx = NAN;
    m[r] = mx;
    {t} sum = 0;
    #pragma omp simd reduction(+:sum)
    for (long j = 0; j < n; j++) {{
      {t} v = {exp}(xr[j] - mx);
      er[j] = v;
      sum += v;
    }}
    s[r] = sum;
    if (!y) continue;
    #pragma omp simd
    for (long j = 0; j < n; j++) yr[j] = er[j] / sum;
  }}
}}
"""
_TYPES = {np.dtype(np.float32): ("float", "expf"), np.dtype(np.float64): ("double", "exp")}


def _uses(ctx):
    uses = getattr(ctx, "_step_uses", None)
    if uses is None:
        uses = {}
        for k, step in enumerate(ctx.steps):
            eqns = step.eqns if type(step) is FusionGroup else [step]
            for e in eqns:
                for v in e.inputs:
                    uses.setdefault(v, []).append((k, step, e))
        ctx._step_uses = uses
    return uses


def _one_use(ctx, v, prim, after):
    """The single use of `v` by the primitive `prim` in a later step: (index, step, eqn)."""
    found = [u for u in _uses(ctx).get(v, []) if u[2].primitive is prim and u[0] > after]
    return found[0] if len(found) == 1 else None


def _to_broadcast(ctx, v, keep, shape, after):
    """Follow v -> reshape(keep) -> [stop_gradient] -> broadcast_in_dim(shape)."""
    use = _one_use(ctx, v, reshape_p, after)
    if use is None or tuple(use[2].outputs[0].aval.shape) != keep:
        return None
    w = use[2].outputs[0]
    stop = _one_use(ctx, w, stop_gradient_p, after)
    if stop is not None:
        w = stop[2].outputs[0]
    b = _one_use(ctx, w, broadcast_in_dim_p, after)
    if b is None or tuple(b[2].params["shape"]) != shape:
        return None
    if tuple(b[2].params["broadcast_dimensions"]) != tuple(range(len(shape))):
        return None
    return b[2].outputs[0]


def _single(step, prim, inputs):
    eqns = step.eqns if type(step) is FusionGroup else [step]
    if len(eqns) != 1 or eqns[0].primitive is not prim:
        return None
    return eqns[0] if set(eqns[0].inputs) == set(inputs) else None


def match_softmax(ctx, eqn, i):
    """The steps a softmax starting at reduce_max `eqn` spans, or None."""
    (x,) = eqn.inputs
    shape = tuple(x.aval.shape)
    nd = len(shape)
    if (
        nd == 0
        or x.aval.dtype not in _TYPES
        or tuple(eqn.params["axes"]) != (nd - 1,)
        or int(np.prod(shape, dtype=np.int64)) < native.NATIVE_MIN_SIZE
    ):
        return None
    keep = shape[:-1] + (1,)
    mb = _to_broadcast(ctx, eqn.outputs[0], keep, shape, i)
    if mb is None:
        return None
    subs = [u for u in _uses(ctx).get(mb, []) if u[2].primitive is sub_p]
    if len(subs) != 1 or type(subs[0][1]) is not FusionGroup:
        return None
    k1, g1, sub = subs[0]
    if [e.primitive for e in g1.eqns] != [sub_p, exp_p] or sub.inputs != [x, mb]:
        return None
    e_var = g1.outputs[0]
    red = _one_use(ctx, e_var, reduce_sum_p, k1)
    if red is None or tuple(red[2].params["axes"]) != (nd - 1,) or red[1] is not red[2]:
        return None
    s_var = red[2].outputs[0]
    sb = _to_broadcast(ctx, s_var, keep, shape, red[0])
    if sb is None:
        return None
    divs = [
        u
        for u in _uses(ctx).get(sb, [])
        if u[2].primitive is div_p and u[2].inputs == [e_var, sb] and u[0] > red[0]
    ]
    div = _single(divs[0][1], div_p, [e_var, sb]) if len(divs) == 1 else None
    # a divide fused into its consumers' group stays there (it reads e and the sum)
    return {
        "x": x,
        "m": eqn.outputs[0],
        "e": e_var,
        "s": s_var,
        "y": None if div is None else div.outputs[0],
        "skip": (g1, red[1]) + (() if div is None else (divs[0][1],)),
    }


def emit_softmax(ctx, eqn, i):
    """Emit the fused softmax at its reduce_max; False when the pattern does not match."""
    if not native.enabled():
        return False
    found = match_softmax(ctx, eqn, i)
    if found is None:
        return False
    x = found["x"]
    shape = tuple(x.aval.shape)
    t, exp = _TYPES[x.aval.dtype]
    fname = f"fflow_softmax_{len(ctx.native_pending)}"
    source = _SOURCE.format(t=t, exp=exp, fname=fname)
    dt = ctx.const(x.aval.dtype, "dt")
    ctx.globals["_contig"] = native._contiguous
    outs = [k for k in ("m", "e", "s", "y") if found[k] is not None]
    names = {k: ctx.name(found[k]) for k in outs}
    ctx.emit(f"{names['m']} = np.empty({shape[:-1]}, {dt})")
    ctx.emit(f"{names['s']} = np.empty({shape[:-1]}, {dt})")
    ctx.emit(f"{names['e']} = np.empty({shape}, {dt})")
    if "y" in names:
        ctx.emit(f"{names['y']} = np.empty({shape}, {dt})")
    xc = f"{ctx.name(x)}_c"
    ctx.emit(f"{xc} = _contig({ctx.name(x)}, {dt})")
    kernel = f"native_{fname}"
    ctx.globals["_ad"] = native.address
    ptrs = [f"_ad({xc})"] + [f"_ad({names[k]})" for k in ("m", "e", "s")]
    ptrs.append(f"_ad({names['y']})" if "y" in names else "None")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    ctx.emit(f"{kernel}({', '.join(ptrs)}, {rows}, {shape[-1]})")
    ctx.native_pending.append((fname, kernel, source, [ctypes.c_void_p] * 5 + [ctypes.c_long] * 2))
    ctx.native_sources.append(source)
    for k in outs:
        if found[k].aval.ndim:
            ctx.fresh.add(found[k])
    ctx.skip.update(id(step) for step in found["skip"])
    return True


__all__ = ["match_softmax", "emit_softmax"]
