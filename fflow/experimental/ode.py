"""`odeint` (JAX's `jax.experimental.ode.odeint`): adaptive Dormand-Prince 5(4) with the
step-size control, dense output and adjoint gradient of JAX's implementation
(Apache-2.0, Hairer, Norsett & Wanner, Sec. II.4), so it gives JAX's numbers.

`odeint(func, y0, t, *args)` solves dy/dt = func(y, t, *args) and returns y at the times
`t` (y0 may be a pytree). Gradients with respect to y0, t and args come from solving the
adjoint system backwards (values `func` closes over are constants: pass what you
differentiate as `args`).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.experimental.ode import odeint
    >>> ys = odeint(lambda y, t, k: -k * y, jnp.ones(1), jnp.array([0.0, 1.0]), 2.0)
    >>> round(float(ys[1, 0]), 4)  # exp(-2)
    0.1353
"""

import functools
import operator

import numpy as np

import fflow.numpy as jnp
from fflow import lax
from fflow.flatten_util import ravel_pytree
from fflow.transforms.ad_api import vjp
from fflow.transforms.custom import custom_vjp
from fflow.transforms.jit import jit
from fflow.transforms.vmap import vmap
from fflow.tree_util import tree_leaves, tree_map

_ALPHA = [1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0, 0.0]
_BETA = [[1 / 5, 0, 0, 0, 0, 0, 0], [3 / 40, 9 / 40, 0, 0, 0, 0, 0],
         [44 / 45, -56 / 15, 32 / 9, 0, 0, 0, 0],
         [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729, 0, 0, 0],
         [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656, 0, 0],
         [35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0]]  # fmt: skip
_C_SOL = [35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0]
_C_ERR = [35 / 384 - 1951 / 21600, 0, 500 / 1113 - 22642 / 50085, 125 / 192 - 451 / 720,
          -2187 / 6784 - -12231 / 42400, 11 / 84 - 649 / 6300, -1.0 / 60.0]  # fmt: skip
_C_MID = [6025192743 / 30085553152 / 2, 0, 51252292925 / 65400821598 / 2,
          -2691868925 / 45128329728 / 2, 187940372067 / 1594534317056 / 2,
          -1776094331 / 19743644256 / 2, 11237099 / 235043384 / 2]  # fmt: skip


def _interp_fit(y0, y1, k, dt):
    """The 4th-order polynomial through a step (dense output between steps)."""
    dt = dt.astype(y0.dtype)
    y_mid = y0 + dt * jnp.dot(jnp.array(_C_MID, y0.dtype), k)
    dy0, dy1 = k[0], k[-1]
    a = -2.0 * dt * dy0 + 2.0 * dt * dy1 - 8.0 * y0 - 8.0 * y1 + 16.0 * y_mid
    b = 5.0 * dt * dy0 - 3.0 * dt * dy1 + 18.0 * y0 + 14.0 * y1 - 32.0 * y_mid
    c = -4.0 * dt * dy0 + dt * dy1 - 11.0 * y0 - 5.0 * y1 + 16.0 * y_mid
    return jnp.stack([a, b, c, dt * dy0, y0])


def _initial_step_size(fun, t0, y0, order, rtol, atol, f0):
    scale = atol + jnp.abs(y0) * rtol
    d0 = jnp.linalg.norm(y0 / scale)
    d1 = jnp.linalg.norm(f0 / scale)
    h0 = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / d1)
    f1 = fun(y0 + h0.astype(y0.dtype) * f0, t0 + h0)
    d2 = jnp.linalg.norm((f1 - f0) / scale) / h0
    h1 = jnp.where(
        (d1 <= 1e-15) & (d2 <= 1e-15),
        jnp.maximum(1e-6, h0 * 1e-3),
        (0.01 / jnp.maximum(d1, d2)) ** (1.0 / (order + 1.0)),
    )
    return jnp.minimum(100.0 * h0, h1)


def _rk_step(func, y0, f0, t0, dt):
    alpha = jnp.array(_ALPHA, dt.dtype)
    beta = jnp.array(_BETA, f0.dtype)

    def body(i, k):
        ti = t0 + dt * alpha[i - 1]
        yi = y0 + dt.astype(f0.dtype) * jnp.dot(beta[i - 1, :], k)
        return k.at[i, :].set(func(yi, ti))

    k = lax.fori_loop(1, 7, body, jnp.zeros((7, f0.shape[0]), f0.dtype).at[0, :].set(f0))
    y1 = dt.astype(f0.dtype) * jnp.dot(jnp.array(_C_SOL, f0.dtype), k) + y0
    y1_error = dt.astype(f0.dtype) * jnp.dot(jnp.array(_C_ERR, f0.dtype), k)
    return y1, k[-1], y1_error, k


def _error_ratio(error, rtol, atol, y0, y1):
    tol = atol + rtol * jnp.maximum(jnp.abs(y0), jnp.abs(y1))
    return jnp.sqrt(jnp.mean((error / tol.astype(error.dtype)) ** 2))


def _optimal_step(last, ratio, safety=0.9, ifactor=10.0, dfactor=0.2, order=5.0):
    dfactor = jnp.where(ratio < 1, 1.0, dfactor)
    factor = jnp.minimum(ifactor, jnp.maximum(ratio ** (-1.0 / order) * safety, dfactor))
    return jnp.where(ratio == 0, last * ifactor, last * factor)


def odeint(func, y0, t, *args, rtol=1.4e-8, atol=1.4e-8, mxstep=np.inf, hmax=np.inf):
    """y(t) for dy/dt = func(y, t, *args), y(t[0]) = y0 (JAX's jax.experimental.ode.odeint)."""
    for arg in tree_leaves(args):
        if callable(arg) and not hasattr(arg, "shape"):
            raise TypeError(
                f"odeint args must be arrays, got the function {arg!r}. Fix: close over it "
                f"in func instead."
            )
    return _wrapper(func, rtol, atol, mxstep, hmax, y0, jnp.asarray(t), *args)


def _solve(func, rtol, atol, mxstep, hmax, y0, ts, *args):
    flat, unravel = ravel_pytree(y0)

    def flat_func(y, t, *a):
        return ravel_pytree(func(unravel(y), t, *a))[0]

    out = _odeint(flat_func, rtol, atol, mxstep, hmax, flat, ts, *args)
    return vmap(unravel)(out)


_wrapper = jit(_solve, static_argnums=(0, 1, 2, 3, 4))


@functools.partial(custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _odeint(func, rtol, atol, mxstep, hmax, y0, ts, *args):
    def func_(y, t):
        return func(y, t, *args)

    def scan_fun(carry, target_t):
        def cond(state):
            i, _, _, t, dt, _, _ = state
            return (t < target_t) & (i < mxstep) & (dt > 0)

        def body(state):
            i, y, f, t, dt, last_t, coeff = state
            next_y, next_f, next_err, k = _rk_step(func_, y, f, t, dt)
            next_t = t + dt
            ratio = _error_ratio(next_err, rtol, atol, y, next_y)
            new_coeff = _interp_fit(y, next_y, k, dt)
            dt = jnp.clip(_optimal_step(dt, ratio), 0.0, hmax)  # the next step either way
            new = [i + 1, next_y, next_f, next_t, dt, t, new_coeff]
            old = [i + 1, y, f, t, dt, last_t, coeff]
            return [jnp.where(ratio <= 1.0, a, b) for a, b in zip(new, old)]

        _, *carry = lax.while_loop(cond, body, [0] + carry)
        _, _, t, _, last_t, coeff = carry
        rel = (target_t - last_t) / (t - last_t)
        return carry, jnp.polyval(coeff, rel.astype(coeff.dtype))

    f0 = func_(y0, ts[0])
    dt = jnp.clip(_initial_step_size(func_, ts[0], y0, 4, rtol, atol, f0), 0.0, hmax)
    init = [y0, f0, ts[0], dt, ts[0], jnp.stack([y0] * 5)]
    _, ys = lax.scan(scan_fun, init, ts[1:])
    return jnp.concatenate((y0[None], ys))


def _odeint_fwd(func, rtol, atol, mxstep, hmax, y0, ts, *args):
    ys = _odeint(func, rtol, atol, mxstep, hmax, y0, ts, *args)
    return ys, (ys, ts, args)


def _odeint_rev(func, rtol, atol, mxstep, hmax, res, g):
    ys, ts, args = res

    def aug_dynamics(state, t, *args):
        # the original system with its vjp, in negative time (solved backwards)
        y, y_bar, *_ = state
        y_dot, vjp_fn = vjp(func, y, -t, *args)
        return (-y_dot, *vjp_fn(y_bar))

    def scan_fun(carry, i):
        y_bar, t0_bar, args_bar = carry
        t_bar = jnp.dot(func(ys[i], ts[i], *args), g[i])
        t0_bar = t0_bar - t_bar
        # not through jit: aug_dynamics is a new closure per backward pass (no retraces)
        _, y_bar, t0_bar, args_bar = _solve(
            aug_dynamics, rtol, atol, mxstep, hmax, (ys[i], y_bar, t0_bar, args_bar),
            jnp.stack([-ts[i], -ts[i - 1]]), *args,
        )  # fmt: skip
        y_bar, t0_bar, args_bar = tree_map(operator.itemgetter(1), (y_bar, t0_bar, args_bar))
        return (y_bar + g[i - 1], t0_bar, args_bar), t_bar

    init = (g[-1], jnp.zeros((), ts.dtype), tree_map(jnp.zeros_like, args))
    (y_bar, t0_bar, args_bar), rev_ts_bar = lax.scan(scan_fun, init, jnp.arange(len(ts) - 1, 0, -1))
    ts_bar = jnp.concatenate([t0_bar[None], rev_ts_bar[::-1]])
    return (y_bar, ts_bar, *args_bar)


_odeint.defvjp(_odeint_fwd, _odeint_rev)

__all__ = ["odeint"]
