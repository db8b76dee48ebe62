"""`dot_general`: batched tensor contraction (matmul, einsum and tensordot build on it).

dimension_numbers = ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch)); the
output's dims are batch, then lhs free, then rhs free (as in XLA and JAX).
"""

import numpy as np
from fflow.transforms import vmap as vm
from fflow.transforms.amp_policy import FOLLOW, FP32, KEEP, LOW
from fflow.transforms.amp_rules import Rounded, amp_rules, keep, target_dtype, widest
from fflow.transforms.autodiff import Zero, defjvp, is_undefined, transpose_rules
from fflow.transforms.shard_rules import Sig, def_sbp
from fflow.transforms.vmap import batch_rules

from fflow import dtypes, threads
from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import DtypeError, ShapeError, user_error
from fflow.sbp import B, P, S

dot_general_p = Primitive("dot_general")
dot_general_p.amp_class = "low"


def _free_dims(ndim, contract, batch):
    return [i for i in range(ndim) if i not in contract and i not in batch]


def _dot_impl(lhs, rhs, *, dimension_numbers, preferred_element_type=None):
    threads.blas()  # fflow owns BLAS threading from the first GEMM on (no spinning pool)
    (lc, rc), (lb, rb) = dimension_numbers
    out_dtype = preferred_element_type or lhs.dtype
    if (
        not lb
        and len(lc) == 1
        and lc[0] == lhs.ndim - 1
        and rc[0] == (0 if rhs.ndim < 2 else rhs.ndim - 2)
        and rhs.ndim <= 2
        and out_dtype == lhs.dtype == rhs.dtype
        and lhs.dtype.kind in "fc"
        and lhs.dtype.itemsize >= 4
    ):
        # the common matmul/matvec: one BLAS call, no transposes (eager per-op cost)
        return np.asarray(np.matmul(lhs, rhs))
    if (
        not lb
        and out_dtype == lhs.dtype == rhs.dtype
        and lhs.dtype.kind in "fc"
        and lhs.dtype.itemsize >= 4
    ):
        # no batch dims: tensordot's output order (lhs free, rhs free) is dot_general's
        return np.asarray(np.tensordot(lhs, rhs, axes=(list(lc), list(rc))))
    compute = lhs.dtype
    if compute.itemsize < 4 and compute.kind == "f" or compute.name == "bfloat16":
        # NumPy's half/bf16 matmul is slow and accumulates in low precision
        compute = np.dtype(np.float32)
    lf = _free_dims(lhs.ndim, lc, lb)
    rf = _free_dims(rhs.ndim, rc, rb)
    bshape = [lhs.shape[i] for i in lb]
    lfs = [lhs.shape[i] for i in lf]
    rfs = [rhs.shape[i] for i in rf]
    k = int(np.prod([lhs.shape[i] for i in lc], dtype=np.int64))
    nb = int(np.prod(bshape, dtype=np.int64))
    m = int(np.prod(lfs, dtype=np.int64))
    n = int(np.prod(rfs, dtype=np.int64))
    a = np.transpose(lhs, list(lb) + lf + list(lc)).reshape(nb, m, k)
    b = np.transpose(rhs, list(rb) + list(rc) + rf).reshape(nb, k, n)
    if a.dtype != compute:
        a = a.astype(compute)
    if b.dtype != compute:
        b = b.astype(compute)
    if nb == 1:
        out = np.asarray(a[0] @ b[0]).reshape((*bshape, *lfs, *rfs))
    else:
        out = np.matmul(a, b).reshape((*bshape, *lfs, *rfs))
    if out.dtype != out_dtype:
        out = out.astype(out_dtype)
    return out


def _dot_abstract_eval(lhs, rhs, *, dimension_numbers, preferred_element_type=None):
    (lc, rc), (lb, rb) = dimension_numbers
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise user_error(ShapeError, f"dot_general: bad dimension_numbers {dimension_numbers}")
    for a, b in zip(lc, rc):
        if lhs.shape[a] != rhs.shape[b]:
            raise user_error(
                ShapeError,
                f"dot_general: contracting dimension {a} of lhs {lhs.shape} (size "
                f"{lhs.shape[a]}) does not match dimension {b} of rhs {rhs.shape} (size "
                f"{rhs.shape[b]})",
            )
    for a, b in zip(lb, rb):
        if lhs.shape[a] != rhs.shape[b]:
            raise user_error(
                ShapeError,
                f"dot_general: batch dimension {a} of lhs {lhs.shape} does not match "
                f"dimension {b} of rhs {rhs.shape}",
            )
    if lhs.dtype != rhs.dtype:
        raise user_error(
            DtypeError,
            f"dot_general: operand dtypes differ ({lhs.dtype.name}, {rhs.dtype.name}); cast first",
        )
    lf = _free_dims(lhs.ndim, lc, lb)
    rf = _free_dims(rhs.ndim, rc, rb)
    shape = [lhs.shape[i] for i in lb] + [lhs.shape[i] for i in lf] + [rhs.shape[i] for i in rf]
    dtype = preferred_element_type or lhs.dtype
    return ShapedArray(shape, dtype, lhs.weak_type and rhs.weak_type)


dot_general_p.def_impl(_dot_impl)
dot_general_p.def_abstract_eval(_dot_abstract_eval)


def _ranges_like(*xs):
    start = 0
    for x in xs:
        yield list(range(start, start + len(x)))
        start += len(x)


def _dot_transpose_lhs(ct, x_shape, y, x_dtype, dimension_numbers, swap=False, preferred=None):
    (xc, yc), (xb, yb) = dimension_numbers
    y_dtype = y.aval.dtype if hasattr(y, "aval") else np.asarray(y).dtype
    if ct.dtype != y_dtype:
        # a mixed-precision dot (bf16 inputs, preferred f32 output): the cotangent
        # is contracted in the inputs' dtype, accumulating in the preferred one
        ct = lax.convert_element_type(ct, y_dtype)
    x_ndim = len(x_shape)
    y_ndim = np.ndim(y) if not hasattr(y, "aval") else y.aval.ndim
    x_free = _free_dims(x_ndim, xc, xb)
    y_free = _free_dims(y_ndim, yc, yb)
    if swap:
        ct_batch, ct_y_free, ct_x_free = _ranges_like(xb, y_free, x_free)
    else:
        ct_batch, ct_x_free, ct_y_free = _ranges_like(xb, x_free, y_free)
    dn = ((tuple(ct_y_free), tuple(y_free)), (tuple(ct_batch), tuple(yb)))
    # out dims: batch, x_free, then y's remaining (contracting) dims in increasing order
    y_contract_sorted = sorted(yc)
    y_part = [xc[list(yc).index(d)] for d in y_contract_sorted]
    x_dims_of_out = list(xb) + x_free + y_part
    if x_dims_of_out != sorted(x_dims_of_out) and list(xb) + y_part + x_free == sorted(
        x_dims_of_out
    ):
        # y first gives x's own dim order (e.g. a weight's gradient x^T @ ct of x @ w):
        # no transpose, so the gradient is contiguous where it is reduced and updated
        dn_y_first = ((tuple(y_free), tuple(ct_y_free)), (tuple(yb), tuple(ct_batch)))
        out = lax.dot_general(y, ct, dn_y_first, preferred_element_type=preferred)
    else:
        out = lax.dot_general(ct, y, dn, preferred_element_type=preferred)
        perm = tuple(int(i) for i in np.argsort(x_dims_of_out))
        out = lax.transpose(out, perm)
    if out.dtype != x_dtype:
        out = lax.convert_element_type(out, x_dtype)
    return out


def _dot_transpose(ct, x, y, *, dimension_numbers, preferred_element_type=None):

    if type(ct) is Zero:
        return [None, None]
    (xc, yc), (xb, yb) = dimension_numbers
    if is_undefined(x):
        ct_x = _dot_transpose_lhs(
            ct, x.aval.shape, y, x.aval.dtype, dimension_numbers, preferred=preferred_element_type
        )
        return [ct_x, None]
    swapped = ((yc, xc), (yb, xb))
    ct_y = _dot_transpose_lhs(
        ct, y.aval.shape, x, y.aval.dtype, swapped, swap=True, preferred=preferred_element_type
    )
    return [None, ct_y]


defjvp(
    dot_general_p,
    lambda g, x, y, **p: lax.dot_general(g, y, **p),
    lambda g, x, y, **p: lax.dot_general(x, g, **p),
)
transpose_rules[dot_general_p] = _dot_transpose
dot_general_p.traits.add("bilinear")
dot_general_p.traits.add("fresh_output")  # its NumPy result is a new array (lowering/schedule.py)


# -- batching rule (vmap) ---------------------------------------------------------------
def _dot_general_batch(vals, dims, *, dimension_numbers, preferred_element_type=None):

    (lhs, rhs), (dl, dr) = vals, dims
    (lc, rc), (lb, rb) = dimension_numbers
    shift = lambda ds: tuple(d + 1 for d in ds)  # noqa: E731
    if dl is not vm.not_mapped and dr is not vm.not_mapped:
        # both batched: the vmapped axis becomes a new leading batch dimension
        lhs, rhs = vm.moveaxis(lhs, dl, 0), vm.moveaxis(rhs, dr, 0)
        dn = ((shift(lc), shift(rc)), ((0,) + shift(lb), (0,) + shift(rb)))
        out_dim = 0
    elif dl is not vm.not_mapped:
        # a free dim of lhs: it comes right after the batch dims in the output
        lhs = vm.moveaxis(lhs, dl, 0)
        dn = ((shift(lc), rc), (shift(lb), rb))
        out_dim = len(lb)
    else:
        rhs = vm.moveaxis(rhs, dr, 0)
        dn = ((lc, shift(rc)), (lb, shift(rb)))
        lhs_ndim = lhs.ndim
        out_dim = len(lb) + (lhs_ndim - len(lc) - len(lb))
    out = dot_general_p.bind(
        lhs, rhs, dimension_numbers=dn, preferred_element_type=preferred_element_type
    )
    return out, out_dim


def _register_dot_batch_rule():

    batch_rules[dot_general_p] = _dot_general_batch


_register_dot_batch_rule()


# ----------------------------------------------------------------------------
# SBP signatures (transforms/shard_rules.py): one mesh axis; S = split, B = broadcast,
# P = partial sum. A `local` kernel gets the device's boxes (e.g. a shard's offset).


def _dot_general_sbp(in_avals, out_avals, *, dimension_numbers, preferred_element_type=None):
    (lc, rc), (lb, rb) = dimension_numbers
    lhs, rhs = in_avals
    lf = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    rf = [i for i in range(rhs.ndim) if i not in rc and i not in rb]
    nb = len(lb)
    sigs = [Sig((S(a), S(b)), (S(i),)) for i, (a, b) in enumerate(zip(lb, rb))]
    sigs += [Sig((S(a), B), (S(nb + j),)) for j, a in enumerate(lf)]
    sigs += [Sig((B, S(b)), (S(nb + len(lf) + j),)) for j, b in enumerate(rf)]
    sigs += [Sig((S(a), S(b)), (P,)) for a, b in zip(lc, rc)]
    sigs += [Sig((P, B), (P,)), Sig((B, P), (P,))]
    return sigs


def_sbp(dot_general_p, _dot_general_sbp)


def _dot_general_amp(trace, prim, cls, ins, params):
    """AMP: low precision inputs, fp32 accumulation, result rounded to the compute dtype.

    The fp32 accumulator is remembered as the rounded value's wider original, so a
    consumer that wants fp32 (a softmax's exp, a loss's sum) reads it unrounded.
    """
    target = target_dtype(trace, cls, ins) if cls in (LOW, FP32, FOLLOW) else KEEP
    if target is KEEP or target is None:
        return keep(trace, ins, dot_general_p, params)
    lhs, rhs = (trace.cast(t, target) for t in ins)
    requested = params.get("preferred_element_type")
    logical_in = ins[0].aval.dtype
    acc = widest([target, dtypes.float32]) if target.itemsize < 4 else target
    out = dot_general_p.bind(lhs, rhs, **dict(params, preferred_element_type=acc))
    if requested is not None and requested != logical_in:
        return lax.convert_element_type(out, requested)  # the user asked for this dtype
    if acc == target:
        return out
    return Rounded(out, target)


amp_rules[dot_general_p] = _dot_general_amp
