"""Learning-rate schedules: functions of the step count (optax's formulas).

They accept a Python int or an int array (a traced count under `jit`).

Example:
    >>> from fflow import optim
    >>> s = optim.warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps=10, decay_steps=110)
    >>> [round(float(s(n)), 3) for n in (0, 5, 10, 60, 110)]
    [0.0, 0.5, 1.0, 0.5, 0.0]
"""

import math

import fflow.numpy as jnp


def _count(count):
    return jnp.asarray(count).astype(jnp.float32)


def constant_schedule(value):
    """The same value at every step."""
    return lambda count: jnp.asarray(value, jnp.float32)


def polynomial_schedule(init_value, end_value, power, transition_steps, transition_begin=0):
    """From init_value to end_value over transition_steps steps, as (1 - t)^power."""
    if transition_steps <= 0:
        return constant_schedule(init_value)

    def schedule(count):
        c = jnp.clip(_count(count) - transition_begin, 0, transition_steps)
        frac = 1 - c / transition_steps
        return (init_value - end_value) * (frac**power) + end_value

    return schedule


def linear_schedule(init_value, end_value, transition_steps, transition_begin=0):
    """Linear from init_value to end_value over transition_steps steps."""
    return polynomial_schedule(init_value, end_value, 1, transition_steps, transition_begin)


def cosine_decay_schedule(init_value, decay_steps, alpha=0.0, exponent=1.0):
    """init_value * ((1 - alpha) * (0.5 (1 + cos(pi t / decay_steps)))^exponent + alpha)."""
    if decay_steps <= 0:
        raise ValueError(f"cosine_decay_schedule: decay_steps must be positive, got {decay_steps}")

    def schedule(count):
        c = jnp.minimum(_count(count), decay_steps)
        cosine = 0.5 * (1 + jnp.cos(math.pi * c / decay_steps))
        return init_value * ((1 - alpha) * cosine**exponent + alpha)

    return schedule


def exponential_decay(
    init_value, transition_steps, decay_rate, transition_begin=0, staircase=False, end_value=None
):
    """init_value * decay_rate ** ((count - transition_begin) / transition_steps)."""
    if transition_steps <= 0:
        return constant_schedule(init_value)

    def schedule(count):
        c = _count(count)
        p = (c - transition_begin) / transition_steps
        if staircase:
            p = jnp.floor(p)
        value = jnp.where(c <= transition_begin, init_value, init_value * decay_rate**p)
        if end_value is not None:
            clip = jnp.maximum if decay_rate < 1 else jnp.minimum
            value = clip(value, end_value)
        return value

    return schedule


def piecewise_constant_schedule(init_value, boundaries_and_scales=None):
    """init_value times every scale whose boundary the count has reached."""
    items = sorted((boundaries_and_scales or {}).items())

    def schedule(count):
        c = _count(count)
        value = jnp.asarray(init_value, jnp.float32)
        for boundary, scale in items:
            value = jnp.where(c < boundary, value, value * scale)
        return value

    return schedule


def join_schedules(schedules, boundaries):
    """schedules[i] from boundaries[i-1] on, each counting from its own boundary."""

    def schedule(count):
        c = jnp.asarray(count)
        out = schedules[0](c)
        for boundary, s in zip(boundaries, schedules[1:]):
            out = jnp.where(c < boundary, out, s(c - boundary))
        return out

    return schedule


def warmup_cosine_decay_schedule(
    init_value, peak_value, warmup_steps, decay_steps, end_value=0.0, exponent=1.0
):
    """Linear warmup to peak_value, then cosine decay to end_value at decay_steps
    (decay_steps counts the warmup, as in optax)."""
    alpha = 0.0 if peak_value == 0.0 else end_value / peak_value
    return join_schedules(
        [
            linear_schedule(init_value, peak_value, warmup_steps),
            cosine_decay_schedule(peak_value, max(decay_steps - warmup_steps, 1), alpha, exponent),
        ],
        [warmup_steps],
    )


def warmup_exponential_decay_schedule(
    init_value, peak_value, warmup_steps, transition_steps, decay_rate, end_value=None
):
    """Linear warmup to peak_value, then exponential decay."""
    return join_schedules(
        [
            linear_schedule(init_value, peak_value, warmup_steps),
            exponential_decay(peak_value, transition_steps, decay_rate, end_value=end_value),
        ],
        [warmup_steps],
    )
