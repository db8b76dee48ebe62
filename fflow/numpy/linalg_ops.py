"""Linear algebra: dot, matmul (`@`), tensordot, einsum (opt_einsum's order), outer,
inner, trace, diag (`linalg.norm` is in fflow/numpy/linalg.py)."""

import functools

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.errors import ShapeError, user_error
from fflow.numpy._util import (
    broadcast_shapes,
    broadcast_to_shape,
    convert,
    info,
    operand,
    promote_dtypes,
)
from fflow.numpy.elementwise import conjugate, multiply
from fflow.numpy.reductions import sum as _sum
from fflow.numpy.shapes import moveaxis, ravel, reshape


def _promote_pair(a, b):

    a, b = operand(a), operand(b)
    dtype, _ = promote_dtypes(a, b)
    return convert(a, dtype), convert(b, dtype)


def matmul(a, b, precision=None, preferred_element_type=None):
    """NumPy's matmul: batch dimensions broadcast; 1-D operands are promoted."""
    a, b = _promote_pair(a, b)
    sa, sb = info(a)[2], info(b)[2]
    if len(sa) == 0 or len(sb) == 0:
        raise user_error(
            ValueError, "matmul: operands must not be scalars. Fix: use * for scalars."
        )
    if len(sa) == 1 and len(sb) == 1:
        if sa[0] != sb[0]:
            raise user_error(
                ShapeError, f"matmul: shapes {sa} and {sb} are not aligned." + _fix(sa, sb)
            )
        return lax.dot_general(
            a, b, (((0,), (0,)), ((), ())), preferred_element_type=preferred_element_type
        )
    if len(sb) == 1:
        if sa[-1] != sb[0]:
            raise user_error(
                ShapeError,
                f"matmul: shapes {sa} and {sb} are not aligned ({sa[-1]} != {sb[0]})."
                + _fix(sa, sb),
            )
        return lax.dot_general(
            a, b, (((len(sa) - 1,), (0,)), ((), ())), preferred_element_type=preferred_element_type
        )
    if len(sa) == 1:
        if sa[0] != sb[-2]:
            raise user_error(
                ShapeError, f"matmul: shapes {sa} and {sb} are not aligned." + _fix(sa, sb)
            )
        out = lax.dot_general(
            a, b, (((0,), (len(sb) - 2,)), ((), ())), preferred_element_type=preferred_element_type
        )
        return out
    if sa[-1] != sb[-2]:
        raise user_error(
            ShapeError,
            f"matmul: shapes {sa} and {sb} are not aligned: {sa[-1]} (dim {len(sa) - 1}) != "
            f"{sb[-2]} (dim {len(sb) - 2})." + _fix(sa, sb),
        )
    if len(sb) == 2:
        # one large matmul over all of a's leading dims
        return lax.dot_general(
            a, b, (((len(sa) - 1,), (0,)), ((), ())), preferred_element_type=preferred_element_type
        )
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    a = broadcast_to_shape(a, batch + tuple(sa[-2:]))
    b = broadcast_to_shape(b, batch + tuple(sb[-2:]))
    nb = len(batch)
    return lax.dot_general(
        a,
        b,
        (((nb + 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))),
        preferred_element_type=preferred_element_type,
    )


def dot(a, b, precision=None, preferred_element_type=None):
    """NumPy's dot: scalars multiply; N-D x M-D contracts a's last and b's second-to-last."""
    a, b = _promote_pair(a, b)
    sa, sb = info(a)[2], info(b)[2]
    if len(sa) == 0 or len(sb) == 0:
        return multiply(a, b)
    if len(sb) <= 2:
        return matmul(a, b, preferred_element_type=preferred_element_type)
    if sa[-1] != sb[-2]:
        raise user_error(ShapeError, f"dot: shapes {sa} and {sb} not aligned." + _fix(sa, sb))
    return lax.dot_general(
        a,
        b,
        (((len(sa) - 1,), (len(sb) - 2,)), ((), ())),
        preferred_element_type=preferred_element_type,
    )


def vdot(a, b, *, precision=None, preferred_element_type=None):
    """Dot product of the flattened inputs, conjugating `a` when complex (as JAX)."""

    if dtypes.is_inexact(info(a)[0]) and info(a)[0].kind == "c":
        a = conjugate(a)
    return dot(
        ravel(a), ravel(b), precision=precision, preferred_element_type=preferred_element_type
    )


def inner(a, b):
    a, b = _promote_pair(a, b)
    sa, sb = info(a)[2], info(b)[2]
    if len(sa) == 0 or len(sb) == 0:
        return multiply(a, b)
    return lax.dot_general(a, b, (((len(sa) - 1,), (len(sb) - 1,)), ((), ())))


def outer(a, b):

    return multiply(reshape(ravel(a), (-1, 1)), ravel(b))


def tensordot(a, b, axes=2, precision=None):
    a, b = _promote_pair(a, b)
    sa, sb = info(a)[2], info(b)[2]
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        ax_a = tuple(range(len(sa) - n, len(sa)))
        ax_b = tuple(range(n))
    else:
        ax_a, ax_b = axes
        ax_a = tuple(np.atleast_1d(ax_a) % max(len(sa), 1))
        ax_b = tuple(np.atleast_1d(ax_b) % max(len(sb), 1))
    for i, j in zip(ax_a, ax_b):
        if sa[i] != sb[j]:
            raise user_error(
                ShapeError, f"tensordot: shape mismatch {sa} and {sb} on axes {ax_a}, {ax_b}"
            )
    return lax.dot_general(a, b, ((ax_a, ax_b), ((), ())))


def trace(a, offset=0, axis1=0, axis2=1, dtype=None):

    return _sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


def diagonal(a, offset=0, axis1=0, axis2=1):

    a = operand(a)
    s = info(a)[2]
    a = moveaxis(a, (axis1, axis2), (-2, -1))
    n, m = info(a)[2][-2:]
    rows = np.arange(max(0, -offset), min(n, m - offset))
    cols = rows + offset
    if len(rows) == 0:
        return lax.full(info(a)[2][:-2] + (0,), 0, info(a)[0])
    nd = len(s)
    idx = np.stack([rows, cols], axis=-1).astype(np.int32)
    out = lax.gather(a, idx, (nd - 2, nd - 1))  # (k, ...rest)
    return lax.transpose(out, tuple(range(1, nd - 1)) + (0,))


def diag(v, k=0):
    v = operand(v)
    s = info(v)[2]
    if len(s) == 1:
        n = s[0] + abs(k)
        rows = np.arange(s[0]) + max(0, -k)
        cols = np.arange(s[0]) + max(0, k)
        idx = np.stack([rows, cols], -1).astype(np.int32)
        return lax.scatter_add(lax.full((n, n), 0, info(v)[0]), idx, v, (0, 1))
    if len(s) == 2:
        return diagonal(v, k)
    raise user_error(ValueError, "diag: input must be 1-D or 2-D")


def kron(a, b):

    a, b = operand(a), operand(b)
    sa, sb = info(a)[2], info(b)[2]
    nd = max(len(sa), len(sb))
    sa = (1,) * (nd - len(sa)) + tuple(sa)
    sb = (1,) * (nd - len(sb)) + tuple(sb)
    a = reshape(a, [d for x in sa for d in (x, 1)])
    b = reshape(b, [d for x in sb for d in (1, x)])
    return reshape(multiply(a, b), [x * y for x, y in zip(sa, sb)])


# -- einsum -----------------------------------------------------------------------------


def einsum(subscripts, *operands, optimize="auto", precision=None, preferred_element_type=None):
    """Einstein summation; pairwise contractions in opt_einsum's order, each one a
    `dot_general`.

    Example:
        >>> import fflow.numpy as jnp
        >>> jnp.einsum("ij,jk->ik", jnp.ones((2, 3)), jnp.ones((3, 4))).shape
        (2, 4)
    """

    if not isinstance(subscripts, str):  # einsum(a, [0, 1], b, [1, 2], [0, 2]) form
        subscripts, operands = _sublist_to_subscripts(subscripts, *operands)
    operands = [operand(o) for o in operands]
    dtype, _ = promote_dtypes(*operands)

    operands = [convert(o, dtype) for o in operands]
    shapes = [tuple(info(o)[2]) for o in operands]
    in_specs, out_spec = _parse_einsum(subscripts, shapes)
    if len(operands) == 1:
        return _einsum_single(operands[0], in_specs[0], out_spec)
    spec = ",".join(in_specs) + "->" + out_spec
    # JAX's path choice: "auto" by default, True -> "optimal", False -> left to right
    if optimize is True:
        path_type = "optimal"
    elif optimize is False or optimize is None:
        path_type = ((0, 1),) * (len(operands) - 1)
    elif isinstance(optimize, (list, tuple)):
        path_type = tuple(tuple(p) for p in optimize)
    else:
        path_type = optimize
    contraction_list = _contraction_list(spec, tuple(shapes), path_type)
    ops = list(operands)
    specs = list(in_specs)
    for contraction in contraction_list:
        inds, _, einsum_str = contraction[0], contraction[1], contraction[2]
        picked = [ops.pop(i) for i in inds]
        picked_specs = [specs.pop(i) for i in inds]
        ins, result = einsum_str.split("->")
        if len(picked) == 1:
            out = _einsum_single(picked[0], picked_specs[0], result)
        else:
            out = _einsum_pair(
                picked[0],
                picked_specs[0],
                picked[1],
                picked_specs[1],
                result,
                preferred_element_type,
            )
        ops.append(out)
        specs.append(result)
    return _einsum_single(ops[0], specs[0], out_spec)


@functools.lru_cache(maxsize=512)
def _contraction_list(spec, shapes, path_type):
    """opt_einsum's pairwise contractions (cached: tracing and eager calls repeat)."""
    import opt_einsum

    optimize = [tuple(p) for p in path_type] if isinstance(path_type, tuple) else path_type
    _, contractions = opt_einsum.contract_path(
        spec, *shapes, shapes=True, einsum_call=True, use_blas=True, optimize=optimize
    )
    return [(c[0], c[1], c[2]) for c in contractions]


def _sublist_to_subscripts(*args):
    """NumPy's interleaved form (op0, sub0, op1, sub1, ..., [out]) as a string spec."""
    args = list(args)
    out = args.pop() if len(args) % 2 == 1 else None
    ops, subs = args[0::2], args[1::2]

    def letters(sub):
        return "".join(
            "..." if s is Ellipsis else "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[s]
            for s in sub
        )

    spec = ",".join(letters(s) for s in subs)
    if out is not None:
        spec += "->" + letters(out)
    return spec, ops


def einsum_path(subscripts, *operands, optimize="auto"):
    """opt_einsum's contraction path and its report, as `jnp.einsum_path` returns them."""
    import opt_einsum

    shapes = [tuple(info(operand(o))[2]) for o in operands]
    path_type = "optimal" if optimize is True else optimize
    return opt_einsum.contract_path(subscripts, *shapes, shapes=True, optimize=path_type)


def _parse_einsum(subscripts, shapes):
    subscripts = subscripts.replace(" ", "")
    if "->" in subscripts:
        ins, out = subscripts.split("->")
    else:
        ins, out = subscripts, None
    in_specs = ins.split(",")
    if len(in_specs) != len(shapes):
        raise user_error(
            ValueError,
            f"einsum: {len(in_specs)} subscripts for {len(shapes)} operands. Fix: one "
            f"comma-separated subscript per operand.",
        )
    letters = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in subscripts)
    ell = None
    if "..." in subscripts:
        n_ell = max(len(s) - (len(spec) - 3) for spec, s in zip(in_specs, shapes) if "..." in spec)
        ell = "".join(next(letters) for _ in range(n_ell))
        in_specs = [
            spec.replace("...", ell[n_ell - (len(s) - (len(spec) - 3)) :])
            if "..." in spec
            else spec
            for spec, s in zip(in_specs, shapes)
        ]
    if out is None:
        counts = {}
        for spec in in_specs:
            for c in spec:
                counts[c] = counts.get(c, 0) + 1
        out = (ell or "") + "".join(
            sorted(c for c, n in counts.items() if n == 1 and (ell is None or c not in ell))
        )
    elif ell is not None:
        out = out.replace("...", ell)
    for spec, s in zip(in_specs, shapes):
        if len(spec) != len(s):
            raise user_error(
                ShapeError,
                f"einsum: subscript {spec!r} has {len(spec)} letters for an operand of shape "
                f"{s}. Fix: one letter per axis (or '...' for the leading ones).",
            )
    sizes = {}
    for spec, s in zip(in_specs, shapes):
        for c, n in zip(spec, s):
            if sizes.setdefault(c, n) != n and 1 not in (n, sizes[c]):
                raise user_error(
                    ShapeError,
                    f"einsum {subscripts!r}: label {c!r} has size {sizes[c]} in one operand "
                    f"and {n} in another (shapes {shapes}). Fix: a repeated label must name "
                    f"axes of equal size.",
                )
    for c in out:
        if c not in sizes:
            raise user_error(
                ValueError,
                f"einsum {subscripts!r}: output label {c!r} appears in no input. Fix: use "
                f"only labels of the inputs on the right of '->'.",
            )
    return in_specs, out


def _einsum_single(x, spec, out):
    from fflow.numpy.linalg_ops import diagonal as _diag

    # repeated letters: take the diagonal
    while len(set(spec)) != len(spec):
        for c in spec:
            if spec.count(c) > 1:
                i = spec.index(c)
                j = spec.index(c, i + 1)
                x = _diag(x, 0, i, j)
                spec = spec[:i] + spec[i + 1 : j] + spec[j + 1 :] + c
                break
    summed = tuple(i for i, c in enumerate(spec) if c not in out)
    if summed:
        x = lax.reduce_sum(x, summed)
        spec = "".join(c for c in spec if c in out)
    if spec != out:
        x = lax.transpose(x, tuple(spec.index(c) for c in out))
    return x


def _einsum_pair(a, sa, b, sb, out, preferred_element_type=None):
    # sum out letters that appear only in one operand and not in the output
    only_a = "".join(c for c in sa if c not in sb and c not in out)
    if only_a or len(set(sa)) != len(sa):
        keep = "".join(c for c in dict.fromkeys(sa) if c not in only_a)
        a = _einsum_single(a, sa, keep)
        sa = keep
    only_b = "".join(c for c in sb if c not in sa and c not in out)
    if only_b or len(set(sb)) != len(sb):
        keep = "".join(c for c in dict.fromkeys(sb) if c not in only_b)
        b = _einsum_single(b, sb, keep)
        sb = keep
    batch = [c for c in sa if c in sb and c in out]
    swapped = "".join(batch) + "".join(c for c in sb if c not in sa)
    if swapped + "".join(c for c in sa if c not in sb) == out:
        # the other operand order gives the output layout directly: no transpose after
        # the GEMM (the contraction path may hand the operands over in either order)
        a, sa, b, sb = b, sb, a, sa
    contract = [c for c in sa if c in sb and c not in out]
    dn = (
        (tuple(sa.index(c) for c in contract), tuple(sb.index(c) for c in contract)),
        (tuple(sa.index(c) for c in batch), tuple(sb.index(c) for c in batch)),
    )
    res = lax.dot_general(a, b, dn, preferred_element_type=preferred_element_type)
    res_spec = (
        "".join(batch)
        + "".join(c for c in sa if c not in sb)
        + "".join(c for c in sb if c not in sa)
    )
    return _einsum_single(res, res_spec, out)


def _fix(sa, sb):
    """The fix line of a matmul shape error: the contracted sizes must agree."""
    ka = sa[-1] if sa else None
    kb = sb[-2] if len(sb) >= 2 else (sb[0] if sb else None)
    hint = " (did you mean b.T?)" if len(sb) >= 2 and sb[-1] == ka else ""
    return (
        f" Fix: a's last axis ({ka}) must equal b's {'second-to-last' if len(sb) >= 2 else 'only'}"
        f" axis ({kb}){hint}; transpose or reshape an operand."
    )
