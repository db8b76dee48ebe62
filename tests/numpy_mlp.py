"""A ReLU MLP's SGD step in float64 NumPy with the backward pass written out: the
independent reference of the data-parallel MLP scripts run on simulated devices and
under `fflow.launch` (tests/device_profile_script.py, tests/shard_plan_dp_script.py)."""

import numpy as np


def relu_mlp_sgd_step(params, x, lr, loss_and_grad):
    """(loss, new params) of one SGD step of the MLP `params` [(w, b), ...] (ReLU
    between layers, none after the last) on `x`; `loss_and_grad(out)` gives the loss
    of the float64 output and its gradient with respect to that output."""
    hs, pre = [x.astype(np.float64)], []
    for i, (w, b) in enumerate(params):
        z = hs[-1] @ w + b
        pre.append(z)
        hs.append(np.maximum(z, 0.0) if i < len(params) - 1 else z)
    loss, g = loss_and_grad(hs[-1])
    new = [None] * len(params)
    for i in reversed(range(len(params))):
        w, b = params[i]
        if i < len(params) - 1:
            g = g * (pre[i] > 0)
        new[i] = (w - lr * (hs[i].T @ g), b - lr * g.sum(0))
        g = g @ w.T
    return loss, new
