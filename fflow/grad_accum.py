"""Gradient accumulation over micro-batches in one program.

`accumulate_gradients(loss_fn, m)` is `value_and_grad(loss_fn)` computed on m
micro-batches and averaged, unrolled into one traced program. Under `shard` with a
data-parallel batch (`in_sbp=(B, S(0))`) every micro-batch's gradient of a broadcast
parameter is partial, the sums stay partial, and the gradient all-reduce happens
once per step, whatever m is.

Micro-batch k takes rows k, k+m, k+2m, ... of the batch (a reshape to (N/m, m, ...)
and an index on axis 1), so a batch split along axis 0 over devices stays split:
each device feeds its own rows to every micro-batch. The loss is the mean of the
micro-batch losses (equal to the whole-batch mean for a mean loss).
"""

from fflow import lax_ops as lax
from fflow.errors import user_error
from fflow.transforms.ad_api import value_and_grad
from fflow.tree_util import tree_map


def accumulate_gradients(loss_fn, num_microbatches, has_aux=False):
    """`(params, batch) -> (loss, grads)` accumulated over `num_microbatches`.

    Args:
        loss_fn: `loss_fn(params, batch) -> scalar` (mean over the batch rows).
        num_microbatches: m; every batch leaf's axis 0 must be divisible by m.
        has_aux: as in `value_and_grad` (aux of the last micro-batch is returned).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> loss = lambda w, b: jnp.mean((b @ w) ** 2)
        >>> step = fflow.accumulate_gradients(loss, 2)
        >>> l, g = step(jnp.ones((2,)), jnp.arange(8.0).reshape(4, 2))
        >>> float(l), g.tolist()
        (69.0, [62.0, 76.0])
    """
    m = int(num_microbatches)
    if m < 1:
        raise user_error(ValueError, f"num_microbatches must be at least 1, got {m}")
    vg = value_and_grad(loss_fn, has_aux=has_aux)

    def piece(x, k):
        if x.ndim == 0 or x.shape[0] % m:
            raise user_error(
                ValueError,
                f"accumulate_gradients cuts axis 0 into {m} micro-batches, but a batch leaf "
                f"has shape {tuple(x.shape)}. Fix: a batch size divisible by {m}.",
            )
        rows = lax.reshape(x, (x.shape[0] // m, m) + tuple(x.shape[1:]))
        return lax.index_in_dim(rows, k, axis=1, keepdims=False)

    def step(params, batch):
        total = grads = aux = None
        for k in range(m):
            out, g = vg(params, tree_map(lambda x, k=k: piece(x, k), batch))
            value, aux = out if has_aux else (out, None)
            total = value if total is None else total + value
            grads = g if grads is None else tree_map(lambda a, b: a + b, grads, g)
        scale = 1.0 / m
        total = total * scale
        grads = tree_map(lambda a: a * scale, grads)
        return ((total, aux) if has_aux else total), grads

    return step
