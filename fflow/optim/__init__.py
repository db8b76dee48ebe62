"""fflow.optim: optimizers as composable gradient transformations (optax's API).

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import optim
    >>> params = {"w": jnp.array([1.0, 2.0])}
    >>> schedule = optim.warmup_cosine_decay_schedule(0.0, 0.1, 10, 100)
    >>> tx = optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(schedule))
    >>> state = tx.init(params)
    >>> @fflow.jit
    ... def step(params, state):
    ...     grads = fflow.grad(lambda p: jnp.sum(p["w"] ** 2))(params)
    ...     updates, state = tx.update(grads, state, params)
    ...     return optim.apply_updates(params, updates), state
    >>> params, state = step(params, state)
    >>> int(state[1][0].count)
    1
"""

from fflow.optim.accumulate import (
    ApplyIfFiniteState,
    MultiSteps,
    MultiStepsState,
    apply_if_finite,
)
from fflow.optim.alias import adagrad, adam, adamw, lamb, lion, rmsprop, sgd
from fflow.optim.base import (
    EmptyState,
    GradientTransformation,
    MaskedState,
    MultiTransformState,
    ScaleByScheduleState,
    add_decayed_weights,
    apply_updates,
    chain,
    clip,
    clip_by_global_norm,
    global_norm,
    identity,
    masked,
    multi_transform,
    scale,
    scale_by_learning_rate,
    scale_by_schedule,
    stateless,
)
from fflow.optim.mixed import MixedPrecisionState, mixed_precision
from fflow.optim.scalers import (
    ScaleByAdamState,
    ScaleByLionState,
    ScaleByRmsState,
    ScaleByRssState,
    ScaleByRStdDevState,
    TraceState,
    scale_by_adam,
    scale_by_lion,
    scale_by_rms,
    scale_by_rss,
    scale_by_stddev,
    scale_by_trust_ratio,
    trace,
)
from fflow.optim.schedules import (
    constant_schedule,
    cosine_decay_schedule,
    exponential_decay,
    join_schedules,
    linear_schedule,
    piecewise_constant_schedule,
    polynomial_schedule,
    warmup_cosine_decay_schedule,
    warmup_exponential_decay_schedule,
)
from fflow.optim.sharding import state_sbp, zero

__all__ = [
    "ApplyIfFiniteState",
    "apply_if_finite",
    "mixed_precision",
    "MixedPrecisionState",
    "MultiSteps",
    "MultiStepsState",
    "adagrad",
    "adam",
    "adamw",
    "lamb",
    "lion",
    "rmsprop",
    "sgd",
    "EmptyState",
    "GradientTransformation",
    "MaskedState",
    "MultiTransformState",
    "ScaleByScheduleState",
    "add_decayed_weights",
    "apply_updates",
    "chain",
    "clip",
    "clip_by_global_norm",
    "global_norm",
    "identity",
    "masked",
    "multi_transform",
    "scale",
    "scale_by_learning_rate",
    "scale_by_schedule",
    "stateless",
    "ScaleByAdamState",
    "ScaleByLionState",
    "ScaleByRmsState",
    "ScaleByRssState",
    "ScaleByRStdDevState",
    "TraceState",
    "scale_by_adam",
    "scale_by_lion",
    "scale_by_rms",
    "scale_by_rss",
    "scale_by_stddev",
    "scale_by_trust_ratio",
    "trace",
    "constant_schedule",
    "cosine_decay_schedule",
    "exponential_decay",
    "join_schedules",
    "linear_schedule",
    "piecewise_constant_schedule",
    "polynomial_schedule",
    "warmup_cosine_decay_schedule",
    "warmup_exponential_decay_schedule",
    "state_sbp",
    "zero",
]
