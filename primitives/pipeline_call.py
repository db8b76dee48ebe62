"""`pipeline_call`: one pipelined training step as one equation (fflow.pipeline).

The `pipe` param is the `fflow.pipelining.Pipeline` object that runs micro-batch
schedules over its stages' placements. Its rules only call that object:

* impl: the forward schedule, returning the loss;
* JVP: the training schedule (forward and backward of every micro-batch, in the
  schedule's order) gives the loss and every input's gradient at once; the output
  tangent is `pipeline_call_lin(grads..., tangents...)` = sum of <grad_i, tangent_i>,
  linear in the tangents, whose transpose hands `ct * grad_i` back to each input.
  So `grad`/`value_and_grad` of a pipeline run each micro-batch's backward inside
  the schedule (1F1B interleaves them), not after the whole forward.

Neither primitive runs under `shard`, `vmap` or `amp`: a pipeline places its own
stages (each stage may be sharded inside).
"""

import numpy as np
from fflow.transforms import vmap as _vmap
from fflow.transforms.autodiff import Zero, jvp_rules, transpose_rules
from fflow.transforms.shard_rules import def_broadcast_only

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray, Tracer
from fflow.errors import user_error

pipeline_call_p = Primitive("pipeline_call")
pipeline_call_p.amp_class = "keep"  # the stages run in the dtypes they were written for


@pipeline_call_p.def_abstract_eval
def _pipeline_call_abstract_eval(*avals, pipe):
    return ShapedArray((), pipe.loss_dtype)


@pipeline_call_p.def_impl
def _pipeline_call_impl(*leaves, pipe):
    return np.asarray(pipe.run_forward(list(leaves)))


def _pipeline_call_jvp(primals, tangents, *, pipe):
    if any(isinstance(p, Tracer) for p in primals):
        raise user_error(
            TypeError,
            "fflow.pipeline runs its schedule on concrete arrays: differentiate it with "
            "grad/value_and_grad directly (its stages are traced and compiled already), "
            "not under jit or vmap, and not twice.",
        )
    want = [type(t) is not Zero for t in tangents]
    loss, grads = pipe.run_train(list(primals), want)
    pairs = [(g, t) for g, t, w in zip(grads, tangents, want) if w and g is not None]
    if not pairs:
        return loss, Zero(ShapedArray((), pipe.loss_dtype))
    gs = [g for g, _ in pairs]
    ts = [t for _, t in pairs]
    return loss, pipeline_call_lin_p.bind(*gs, *ts)


jvp_rules[pipeline_call_p] = _pipeline_call_jvp

# -- the linear tangent map: sum_i <g_i, t_i> ------------------------------------------

pipeline_call_lin_p = Primitive("pipeline_call_lin")
pipeline_call_lin_p.amp_class = "keep"
pipeline_call_lin_p.traits.add("linear_in_tangents")


@pipeline_call_lin_p.def_abstract_eval
def _lin_abstract_eval(*avals):
    return ShapedArray((), avals[0].dtype)


@pipeline_call_lin_p.def_impl
def _lin_impl(*args):
    n = len(args) // 2
    total = sum(np.vdot(np.asarray(g), np.asarray(t)) for g, t in zip(args[:n], args[n:]))
    return np.asarray(total, np.asarray(args[0]).dtype)


def _lin_jvp(primals, tangents):
    n = len(primals) // 2
    if any(type(t) is not Zero for t in tangents[:n]):
        raise user_error(TypeError, "fflow.pipeline gradients cannot be differentiated again.")
    out = pipeline_call_lin_p.bind(*primals)
    ts = [Zero(p.aval) if type(t) is Zero else t for p, t in zip(primals[n:], tangents[n:])]
    if all(type(t) is Zero for t in ts):
        return out, Zero(ShapedArray((), out.dtype))
    ts = [_zeros_like(p) if type(t) is Zero else t for p, t in zip(primals[n:], ts)]
    return out, pipeline_call_lin_p.bind(*primals[:n], *ts)


def _zeros_like(x):
    return lax.full(x.shape, 0, x.dtype)


jvp_rules[pipeline_call_lin_p] = _lin_jvp


def _lin_transpose(ct, *args):
    n = len(args) // 2
    if type(ct) is Zero:
        return [None] * len(args)
    return [None] * n + [_scale(g, ct) for g in args[:n]]


def _scale(g, ct):
    if not isinstance(ct, Tracer) and float(np.asarray(ct)) == 1.0:
        return g  # the usual case, grad of the loss: hand the gradient back as it is
    if not isinstance(ct, Tracer):
        return g * float(np.asarray(ct))
    return g * lax.broadcast_in_dim(ct, g.shape, ())


transpose_rules[pipeline_call_lin_p] = _lin_transpose

for _p in (pipeline_call_p, pipeline_call_lin_p):
    _vmap.no_batch_rule[_p] = (
        "a pipeline runs its own micro-batch schedule over placements; vmap its stages instead"
    )
    def_broadcast_only(_p, "a pipeline places its own stages; it never runs inside a shard program")
