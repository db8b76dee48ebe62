"""The matcher of the attention rewrite (transforms/attention_rewrite.py): sees binds in
order and, at a `dot_general` closing `softmax(q @ kᵀ · scale + mask) @ v`, binds the
fused `dot_product_attention` instead (the rules are in attention_rewrite's docstring).
"""

import logging
import math

import numpy as np
from fflow.primitives.attention import attention_p
from fflow.primitives.binary import add_p, div_p, mul_p, sub_p
from fflow.primitives.compare import and_p, select_n_p
from fflow.primitives.convert import convert_element_type_p
from fflow.primitives.dot import dot_general_p
from fflow.primitives.reduction import reduce_max_p, reduce_sum_p
from fflow.primitives.shape import broadcast_in_dim_p, reshape_p, transpose_p
from fflow.primitives.unary import exp_p, not_p, stop_gradient_p

import fflow.errors as errors
from fflow import core, dtypes
from fflow import lax_ops as lax
from fflow.array import Array
from fflow.core import aval_of_value, set_current_trace

logger = logging.getLogger("fflow.rewrite")

MASK_FILL = -1e4  # a fill at or below this (after the scales) is a mask, not a bias
CONST_LIMIT = 1 << 22  # evaluate constant masks/scales up to this many elements


def _is_float(dt):
    return dtypes.is_inexact(dt) and np.dtype(dt).kind != "c"


class _Match:
    """What one attention looks like: operands, layouts, scale and masks."""

    def __init__(self):
        self.need = []  # (value, reads) of every intermediate the rewrite replaces
        self.scale = 1.0
        self.masks = []  # (kind, value, negate, fill); kind "pred" (traced) or "const"


class Rewriter:
    """Sees every bind in order; remembers what made each value and how often values
    were read, and at a `dot_general` that can close an attention binds the fused
    primitive on `target` instead (everything else is bound there unchanged)."""

    def __init__(self, target, ctx):
        self.target = target
        self.ctx = ctx
        self.made = {}  # id(value) -> (prim, args, params)
        self.reads = {}  # id(value) -> reads so far
        self.total = None  # id(value) -> reads in the whole program (the program pass)
        self.keep = []  # the values whose ids key the tables stay alive
        self.consts = {}
        self.fired = []  # (ordinal, intermediates) of each rewrite

    def bind(self, prim, args, params):
        for a in args:
            self.reads[id(a)] = self.reads.get(id(a), 0) + 1
        out = None
        if prim is dot_general_p and len(args) == 2:
            out = self._rewrite(args, params)
        if out is None:
            with set_current_trace(self.target):
                out = prim.bind(*args, **params)
        outs = out if prim.multiple_results else [out]
        for o in outs:
            if not any(o is a for a in args):  # a view returning its input: no cycle
                self.made[id(o)] = (prim, args, params)
                self.keep.append(o)
        return out

    # -- looking back from a value ------------------------------------------------------
    def _src(self, x, prim=None):
        r = self.made.get(id(x))
        if r is None or (prim is not None and r[0] is not prim):
            return None
        return r

    def _read_count(self, x):
        if self.total is not None and id(x) in self.total:
            return self.total[id(x)]
        return self.reads.get(id(x), 0)

    def _const(self, x):
        """x's value if it is computed from constants only (a NumPy array), else None."""
        if isinstance(x, core.Tracer):
            hit = self.consts.get(id(x))
            if hit is not None:
                return hit
            r = self._src(x)
            if r is None:
                return None
            prim, args, params = r
            if prim.multiple_results or "effect" in prim.traits:
                return None
            vals = [self._const(a) for a in args]
            if any(v is None for v in vals):
                return None
            big = aval_of_value(x).size > CONST_LIMIT
            if big and len(vals) == 1 and "elementwise" in prim.traits:
                # a cast of a broadcast fill: computed on its one distinct element
                small = vals[0][tuple(slice(0, 1) if st == 0 else slice(None)
                                      for st in vals[0].strides)]  # fmt: skip
                if small.size > CONST_LIMIT:
                    return None
                with np.errstate(all="ignore"):
                    value = np.broadcast_to(np.asarray(prim.impl(small, **params)), vals[0].shape)
            elif big and not _sorted_broadcast(prim, params):
                return None
            elif _sorted_broadcast(prim, params):  # a view, not a copy, of a scalar fill
                shape, dims = params["shape"], params["broadcast_dimensions"]
                src = vals[0].reshape([vals[0].shape[dims.index(d)] if d in dims else 1
                                       for d in range(len(shape))])  # fmt: skip
                value = np.broadcast_to(src, shape)
            else:
                try:
                    with np.errstate(all="ignore"):
                        value = np.asarray(prim.impl(*vals, **params))
                except Exception:
                    return None
            self.consts[id(x)] = value
            return value
        if isinstance(x, Array) and x._sharding is None and type(x._value) is np.ndarray:
            return x._value
        if isinstance(x, (np.ndarray, np.generic, bool, int, float)):
            return np.asarray(x)
        return None

    def _uniform(self, x):
        """The float value of a constant with all elements equal, else None."""
        c = self._const(x)
        if c is None or c.size == 0 or not _is_float(c.dtype):
            return None
        flat = c[tuple(slice(0, 1) if st == 0 else slice(None) for st in c.strides)].reshape(-1)
        first = flat[0]
        if not (np.all(flat == first) or np.all(np.isnan(flat))):
            return None
        return float(first)

    def _through(self, x, m, prims):
        """Follow x back through single-reader `prims` (float casts only)."""
        while True:
            r = self._src(x)
            if r is None or r[0] not in prims:
                return x
            if r[0] is convert_element_type_p and not _is_float(aval_of_value(r[1][0]).dtype):
                return x
            m.need.append((x, 1))
            x = r[1][0]

    def _row_stat(self, z, x, red, m):
        """z = red(x, last axis) broadcast back to x's shape (keepdims, reshape,
        stop_gradient, [..., None]); returns the reduced value or None."""
        full = aval_of_value(x).shape
        kept = (full[:-1], full[:-1] + (1,))
        if aval_of_value(z).shape != full:
            return None
        while True:
            r = self._src(z)
            if r is None:
                return None
            prim, args, params = r
            shape = aval_of_value(args[0]).shape
            if prim is red:
                if params.get("axes") != (len(full) - 1,) or shape != full:
                    return None
                m.need.append((z, 1))
                return args[0]
            if prim is broadcast_in_dim_p:
                if shape not in kept or params["broadcast_dimensions"] != tuple(range(len(shape))):
                    return None
            elif prim not in (reshape_p, stop_gradient_p) or shape not in kept:
                return None
            m.need.append((z, 1))
            z = args[0]

    # -- the pattern --------------------------------------------------------------------
    def _softmax_input(self, p, m):
        """p = softmax(x, axis=-1) spelled out: x, else None."""
        p = self._through(p, m, (convert_element_type_p,))
        r = self._src(p, div_p)
        if r is None:
            return None
        e, z = r[1]
        m.need.append((p, 1))
        r = self._src(e, exp_p)
        if r is None or self._row_stat(z, e, reduce_sum_p, m) is not e:
            return None
        m.need.append((e, 2))
        d = self._through(r[1][0], m, (convert_element_type_p,))
        r = self._src(d, sub_p)
        if r is None:
            return None
        x, mx = r[1]
        if self._row_stat(mx, x, reduce_max_p, m) is not x:
            return None
        m.need += [(d, 1), (x, 2)]
        return x

    def _scores(self, x, m):
        """Walk from the softmax's input back to the q·kᵀ dot_general, collecting the
        scale and the masks: the dot's output, or a reason string."""
        shape = aval_of_value(x).shape
        after = 1.0  # product of the scales applied after the current point
        first = True
        while True:
            r = self._src(x)
            if r is None:
                return "the scores are not a dot_general of q and k"
            prim, args, params = r
            if aval_of_value(x).shape != shape:
                return "the scores change shape between the matmul and the softmax"
            if not first:
                m.need.append((x, 1))
            first = False
            if prim is dot_general_p:
                m.scale *= after
                return x
            if prim is convert_element_type_p:
                if not _is_float(aval_of_value(args[0]).dtype):
                    return "the scores are cast from a non-float dtype"
                x = args[0]
            elif prim in (mul_p, div_p):
                c = self._uniform(args[1])
                other = args[0]
                if c is None and prim is mul_p:
                    c, other = self._uniform(args[0]), args[1]
                if c is None:
                    return "the scores are scaled by a traced or non-uniform factor"
                if not (math.isfinite(c) and (c != 0 or prim is mul_p)):
                    return f"the scores are scaled by {c:g}"
                after *= c if prim is mul_p else 1.0 / c
                x = other
            elif prim is select_n_p and len(args) == 3:
                pred, a, b = args
                if aval_of_value(pred).dtype != np.bool_:
                    return "a select with a non-bool predicate"
                fa, fb = self._uniform(a), self._uniform(b)
                if fa is not None and fb is None:
                    fill, negate, x = fa, False, b
                elif fb is not None and fa is None:
                    fill, negate, x = fb, True, a
                else:
                    return "a where() whose fill is not a constant scalar"
                fill *= after
                if not (fill == -math.inf or fill <= MASK_FILL):
                    return f"a where() fill of {fill:g} is not a mask (-inf or <= {MASK_FILL:g})"
                m.masks.append(("pred", pred, negate, fill))
            elif prim is add_p:
                a, b = args
                ca, cb = self._const(a), self._const(b)
                add, x = (ca, b) if ca is not None else (cb, a)
                if add is None or not _is_float(add.dtype):
                    return ("an additive term that is not a constant 0/-inf mask (for a "
                            "runtime mask write where(mask, s, -1e9))")  # fmt: skip
                add = add[tuple(slice(0, 1) if st == 0 else slice(None) for st in add.strides)]
                eff = add.astype(np.float64) * after  # its distinct entries (no broadcast)
                if not np.all((eff == 0) | (eff <= MASK_FILL)):
                    return "an additive term that is not a 0/-inf mask (a bias)"
                m.masks.append(("const", eff == 0, False, -math.inf))
            else:
                return f"{prim.name} between the matmul and the softmax"

    def _peel(self, x, m):
        """An operand of a dot: (source, axes, cast dtype or None) through transposes,
        at most one float cast and (when `m` collects them) constant scalar scales."""
        nd = aval_of_value(x).ndim
        axes = list(range(nd))
        cast = None
        while True:
            r = self._src(x)
            if r is None:
                break
            prim, args, params = r
            if prim is transpose_p:
                perm = params["permutation"]
                axes = [perm[a] for a in axes]
                x = args[0]
            elif prim is convert_element_type_p and cast is None:
                if not _is_float(aval_of_value(args[0]).dtype):
                    break
                cast, x = aval_of_value(x).dtype, args[0]
            elif prim in (mul_p, div_p) and m is not None:
                c = self._uniform(args[1])
                other = args[0]
                if c is None and prim is mul_p:
                    c, other = self._uniform(args[0]), args[1]
                if c is None or aval_of_value(other).shape != aval_of_value(x).shape:
                    break
                if not (math.isfinite(c) and (c != 0 or prim is mul_p)):
                    break
                m.scale *= c if prim is mul_p else 1.0 / c
                x = other
            else:
                break
        return x, axes, cast

    def _match(self, args, params):
        """A `_Match` for `dot_general(*args)` closing an attention, a reason string
        when it nearly does, or None when it is no attention at all."""
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        for side in (0, 1):
            m = _Match()
            p, v = args[side], args[1 - side]
            pc, vc = (lc, rc) if side == 0 else (rc, lc)
            pb, vb = (lb, rb) if side == 0 else (rb, lb)
            x = self._softmax_input(p, m)
            if x is None:
                continue
            nd = aval_of_value(x).ndim
            nb = nd - 2
            if nb < 0 or tuple(pc) != (nd - 1,) or sorted(pb) != list(range(nb)):
                continue  # e.g. the hand-written backward's probsᵀ @ ct
            s = self._scores(x, m)
            if isinstance(s, str):
                return s
            m.side, m.pb, m.vb, m.vc, m.v = side, tuple(pb), tuple(vb), vc[0], v
            (qc, kc), (qb, kb) = self._src(s)[2]["dimension_numbers"]
            q, k = self._src(s)[1]
            if len(qc) != 1 or aval_of_value(q).ndim != nb + 2 or aval_of_value(k).ndim != nb + 2:
                return "q·kᵀ contracts more than the head axis"
            m.q = (q, tuple(qb), _free(q, qb, qc), qc[0])
            m.k = (k, tuple(kb), _free(k, kb, kc), kc[0])
            m.nb, m.b_sizes = nb, aval_of_value(x).shape[:nb]
            return m
        return None

    # -- the rewrite --------------------------------------------------------------------
    def _rewrite(self, args, params):
        where = errors.user_source_info() or "?"
        try:
            m = self._match(args, params)
        except Exception as e:  # a spelling the matcher did not expect: keep the user's
            logger.warning("attention rewrite failed at %s (left as written): %r", where, e)
            m = f"the matcher failed ({type(e).__name__}: {e}); please report it"
        if m is None:
            return None
        if isinstance(m, str):
            self._note(f"{where}: attention left as written: {m}")
            return None
        extra = [(x, n) for x, n in m.need if self._read_count(x) != n]
        if extra:
            self._note(f"{where}: attention left as written: an intermediate "
                       f"({aval_of_value(extra[0][0]).str_short()}) has other readers")  # fmt: skip
            return None
        ordinal = self.ctx.count
        self.ctx.count += 1
        if ordinal in self.ctx.excluded:
            self._note(f"{where}: attention left as written: an intermediate has other "
                       f"readers after the product")  # fmt: skip
            return None
        out_aval = dot_general_p.abstract_eval(*(aval_of_value(a) for a in args), **params)
        try:
            with set_current_trace(self.target):
                out = self._emit(m, out_aval)
        except Exception as e:  # a case the matcher let through wrongly: keep the user's
            logger.warning("attention rewrite failed at %s (left as written): %r", where, e)
            out = f"the rewrite failed ({type(e).__name__}: {e}); please report it"
        if isinstance(out, str):
            self._note(f"{where}: attention left as written: {out}")
            return None
        self.fired.append((ordinal, m.need))
        self._note(f"{where}: softmax(q·kᵀ·{m.scale:.6g}{self._mask_text}) @ v -> "
                   f"dot_product_attention {out_aval.str_short()}", done=True)  # fmt: skip
        return out

    def _note(self, text, done=False):
        logger.debug(text)
        self.ctx.log.append(("rewritten " if done else "") + text)

    def late_readers(self, outs):
        """Ordinals of rewrites whose intermediates were read after the product (or are
        outputs): the autodiff hook cannot know those readers when it rewrites."""
        out_ids = {id(o) for o in outs}
        late = set()
        for n, need in self.fired:
            if any(self.reads.get(id(x), 0) != k or id(x) in out_ids for x, k in need):
                late.add(n)
        return late

    def _operand(self, peeled, batch, free, contract):
        """q/k/v in the primitive's [B, T, N, H] layout (one transpose, one reshape)."""
        src, axes, cast = peeled
        if cast is not None:
            src = lax.convert_element_type(src, cast)
        order = [axes[a] for a in batch]
        order = (order[:-1] + [axes[free]] + order[-1:] if len(batch) >= 2
                 else order + [axes[free]]) + [axes[contract]]  # fmt: skip
        y = lax.transpose(src, order)
        sizes = aval_of_value(y).shape
        nb = len(batch)
        if nb >= 2:
            new = (math.prod(sizes[: nb - 1]), *sizes[nb - 1 :])
        else:
            new = ((sizes[0] if nb else 1), sizes[nb], 1, sizes[nb + 1])
        return lax.reshape(y, new)

    def _emit(self, m, out_aval):
        nb = m.nb
        (q, qb, qf, qc), (k, kb, kf, kc) = m.q, m.k
        qp, kp = self._peel(q, m), self._peel(k, m)  # scales of q and k join m.scale
        vb = tuple(m.vb[m.pb.index(j)] for j in range(nb))  # v's batch axes, scores' order
        vf = _free(m.v, m.vb, (m.vc,))
        vp = self._peel(m.v, None)
        kinds = {aval_of_value(p[0]).dtype if p[2] is None else p[2] for p in (qp, kp, vp)}
        if len(kinds) != 1 or not _is_float(kinds.pop()):
            return "q, k and v have different dtypes"
        if min(qf, kf, vf) < 0:
            return "q, k or v has more than one free axis"
        if nb >= 2:  # k and v repeated per query head (jnp.repeat): grouped-query heads
            kg, vg = self._gqa(kp, kp[1][kb[-1]]), self._gqa(vp, vp[1][vb[-1]])
            if kg is not None and vg is not None and kg[3] == vg[3]:
                kp, vp = kg[:3], vg[:3]
        q, k, v = (self._operand(qp, qb, qf, qc), self._operand(kp, kb, kf, kc),
                   self._operand(vp, vb, m.vc, vf))  # fmt: skip
        t, s = aval_of_value(q).shape[1], aval_of_value(k).shape[1]
        if aval_of_value(k).shape[:3] != aval_of_value(v).shape[:3]:
            return "k and v do not line up"
        mask, causal = self._mask(m, t, s)
        if isinstance(mask, str):
            return mask
        extra = () if mask is None else (mask,)
        out, _ = attention_p.bind(q, k, v, *extra, scale=float(m.scale), causal=causal,
                                  has_mask=mask is not None)  # fmt: skip
        # back to dot_general's layout: batch axes in pb's order, then T, Hv (or Hv, T)
        hv = aval_of_value(out).shape[3]
        if nb >= 2:
            out = lax.reshape(out, (*m.b_sizes[:-1], t, m.b_sizes[-1], hv))
            to_score = list(range(nb - 1)) + [nb, nb - 1, nb + 1]
        else:
            out = lax.reshape(out, (*m.b_sizes, t, hv))
            to_score = list(range(nb + 2))
        tail = [nb, nb + 1] if m.side == 0 else [nb + 1, nb]
        out = lax.transpose(out, [to_score[a] for a in list(m.pb) + tail])
        if aval_of_value(out).dtype != out_aval.dtype:
            out = lax.convert_element_type(out, out_aval.dtype)
        if aval_of_value(out).shape != out_aval.shape:
            raise AssertionError("attention rewrite: output layout")  # a bug, not the user's
        return out

    def _gqa(self, peeled, head):
        """The operand with K heads when it is each of K heads repeated G times along
        axis `head` of its source (`jnp.repeat`: a broadcast, then a reshape merging
        (K, G)): (source, axes, cast, K), else None."""
        src, axes, cast = peeled
        r = self._src(src, reshape_p)
        rep = None if r is None else r[1][0]
        b = None if rep is None else self._src(rep, broadcast_in_dim_p)
        if b is None:
            return None
        big, rs = aval_of_value(src).shape, aval_of_value(rep).shape
        fits = len(rs) == len(big) + 1 and rs[:head] == big[:head]
        fits = fits and rs[head + 2 :] == big[head + 1 :] and rs[head] * rs[head + 1] == big[head]
        small, dims = b[1][0], b[2]["broadcast_dimensions"]
        if not fits or list(dims) != sorted(dims):
            return None
        sshape = aval_of_value(small).shape
        for a in range(len(rs)):  # every axis whole, except G: new or of size 1
            size = sshape[dims.index(a)] if a in dims else None
            if (a == head + 1 and size not in (None, 1)) or (a != head + 1 and size != rs[a]):
                return None
        shape = big[:head] + (rs[head],) + big[head + 1 :]
        return lax.reshape(small, shape), axes, cast, rs[head]

    def _mask(self, m, t, s):
        """The primitive's mask [B|1, N|1, T|1, S] and causal flag (or a reason)."""
        self._mask_text = ""
        if not m.masks:
            return None, False
        strict = any(kind == "const" or fill == -math.inf for kind, _, _, fill in m.masks)
        parts = []
        for kind, value, negate, _ in m.masks:
            c = value if kind == "const" else self._const(value)
            if c is None and strict:
                return ("a -inf or additive mask that is not a constant (a fully masked row "
                        "is NaN by hand, the mean in the primitive)"), False  # fmt: skip
            if c is not None:
                c = _shrink_const(c)
                parts.append(~c if negate else c)
            else:
                value = self._shrink(value)
                parts.append(not_p.bind(value) if negate else value)
        consts = [p for p in parts if isinstance(p, np.ndarray)]
        traced = [p for p in parts if not isinstance(p, np.ndarray)]
        valid = None
        if consts:
            valid = consts[0]
            for p in consts[1:]:
                valid = valid & p
            if strict and not np.all(valid.any(axis=-1)):
                return "a constant mask leaves a query with no key", False
            valid = _shrink_const(valid)
            if not traced and all(n == 1 for n in valid.shape[:-2]):
                tri = np.tril(np.ones((t, s), bool))
                if np.array_equal(np.broadcast_to(valid.reshape(valid.shape[-2:]), (t, s)), tri):
                    self._mask_text = " + causal mask"
                    return None, True
        mask = valid
        for p in traced:
            mask = p if mask is None else and_p.bind(*_same_shape(mask, p))
        self._mask_text = " + mask"
        return self._mask_layout(mask, m, s), False

    def _shrink(self, pred):
        """A traced mask without its broadcast to the scores' shape (when it is one)."""
        r = self._src(pred, broadcast_in_dim_p)
        if r is None:
            return pred
        (m0,), params = r[1], r[2]
        dims, shape = params["broadcast_dimensions"], params["shape"]
        if list(dims) != sorted(dims):
            return pred
        m0_shape = aval_of_value(m0).shape
        return lax.reshape(m0, [m0_shape[dims.index(d)] if d in dims else 1
                                for d in range(len(shape))])  # fmt: skip

    def _mask_layout(self, mask, m, s):
        nb = m.nb
        shape = aval_of_value(mask).shape
        if nb >= 3:
            if any(n != 1 for n in shape[: nb - 1]):  # merged batch axes: broadcast first
                shape = (*m.b_sizes[: nb - 1], *shape[nb - 1 :])
                mask = lax.broadcast_in_dim(mask, shape, tuple(range(len(shape))))
            mask = lax.reshape(mask, (math.prod(shape[: nb - 1]), *shape[nb - 1 :]))
        elif nb == 1:  # [B, T, S] -> [B, 1, T, S] (one head)
            mask = lax.reshape(mask, shape[:1] + (1,) + shape[1:])
        elif nb == 0:
            mask = lax.reshape(mask, (1, 1) + shape)
        shape = aval_of_value(mask).shape
        if shape[3] != s:
            mask = lax.broadcast_in_dim(mask, shape[:3] + (s,), (0, 1, 2, 3))
        return mask


def _sorted_broadcast(prim, params):
    dims = params.get("broadcast_dimensions")
    return prim is broadcast_in_dim_p and list(dims) == sorted(dims)


def _free(x, batch, contract):
    free = [a for a in range(aval_of_value(x).ndim) if a not in batch and a not in contract]
    return free[0] if len(free) == 1 else -1


def _same_shape(a, b):
    sa, sb = aval_of_value(a).shape, aval_of_value(b).shape
    shape = tuple(max(x, y) for x, y in zip(sa, sb))
    dims = tuple(range(len(shape)))
    return lax.broadcast_in_dim(a, shape, dims), lax.broadcast_in_dim(b, shape, dims)


def _shrink_const(valid):
    """A constant mask with the axes it does not vary along kept at size 1."""
    valid = valid[tuple(slice(0, 1) if st == 0 else slice(None) for st in valid.strides)]
    for axis in range(valid.ndim):
        first = np.take(valid, [0], axis=axis)
        if valid.shape[axis] > 1 and np.array_equal(np.broadcast_to(first, valid.shape), valid):
            valid = first
    return np.ascontiguousarray(valid)


__all__ = ["Rewriter", "MASK_FILL"]
